"""The completion-receipt file store (docs/design.md §3.11, §3.12).

Root and shards are 0700. Reads are bounded (at most one byte past the 4 KiB limit, so an
oversize file is recognised without reading it all), refuse symlinks (O_NOFOLLOW) and
anything but a regular file. Quarantine moves a file by hard-link + unlink into
``.quarantine/<shard>/`` (never overwriting), and every directory change that keeps evidence
is fsynced (removing a consumed receipt keeps none: see ``remove``).
Files are found by attempt id only: this store never lists a directory. That includes the
shim's temp files (its reserved receipt, its truncation fact's temp beside the log): their
names derive from the attempt id, so whoever settles the journal entry removes what a shim
killed mid-publication left behind (docs/design.md §3.11). The one exception is the root's
own ``.spare-*.tmp`` files, the reservations spares make ahead of their launch
(launch-protocol.md §8), which ``sweep_spares`` lists at the worker's start.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.domain.artifacts import (
    SHARD_NAMES,
    quarantine_relpath,
    receipt_relpath,
    receipt_temp_relpath,
    truncation_fact_temp_relpath,
)
from app.domain.errors import ReceiptInvalid
from app.domain.execution import ReservationState
from app.domain.receipt import RECEIPT_MAX_BYTES
from app.storage.durable import CANNOT_WRITE, fsync_dir, move_by_link
from app.worker.identity import current_boot_id, runs

DIR_MODE = 0o700
# What recovery writes into the receipt's temp name when it takes it first: no shim ever
# writes this (a shim writes its identity, then the receipt), so a pass that crashed after
# taking the name recognises its own fence.
FENCE_MARK = b'{"fence":"recovery"}'


def _private_dir(path: Path) -> bool:
    """Create ``path`` as 0700 if missing (True when created); refuse a symlink or non-dir."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a private directory", str(path)) from None
        if stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.chmod(path, DIR_MODE)
        return False
    os.chmod(path, DIR_MODE)  # mkdir honours the umask; the mode must be exact
    return True


class ReceiptStore:
    """Receipt files under ``root``, addressed by attempt id; ``logs_root`` for fact temps."""

    def __init__(self, root: Path, *, logs_root: Path | None = None) -> None:
        self.root = Path(root)
        self.logs_root = None if logs_root is None else Path(logs_root)

    def ensure_root(self) -> None:
        """Create the root (0700) and its quarantine root."""
        self.root.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        if _private_dir(self.root):
            fsync_dir(self.root.parent)
        if _private_dir(self.root / ".quarantine"):
            fsync_dir(self.root)

    def ensure_shards(self) -> int:
        """Create every shard directory (0700) at once, with one fsync of the root, so that a
        launch finds its shard made (``ensure_shard`` then syncs nothing). A shard that cannot
        be made here (a file or symlink in its place) is left to ``ensure_shard``, which fails
        only the launches that hash to it (``RECEIPT_DIR_FAILED``), as before; the count of
        such shards is returned. A full disk, a read-only mount or a root the service may not
        write to would fail every launch: that OSError is raised (the start refuses)."""
        created = False
        refused = 0
        for name in SHARD_NAMES:
            try:
                created = _private_dir(self.root / name) or created
            except OSError as exc:
                if exc.errno in CANNOT_WRITE:
                    raise
                refused += 1
        if created:
            fsync_dir(self.root)
        return refused

    def path_of(self, attempt_id: str) -> Path:
        """Absolute path of the attempt's receipt."""
        return self.root / receipt_relpath(attempt_id)

    def ensure_shard(self, attempt_id: str) -> Path:
        """Create the attempt's shard directory (0700) and return it.

        The root is checked when the worker starts (``ensure_root``) and again only when it
        has gone missing since: once per launch it cost two mkdirs and two lstats more.
        """
        shard = self.path_of(attempt_id).parent
        try:
            created = _private_dir(shard)
        except FileNotFoundError:
            self.ensure_root()
            created = _private_dir(shard)
        if created:
            fsync_dir(self.root)
        return shard

    def read(self, attempt_id: str) -> bytes | None:
        """The receipt bytes (at most limit + 1), or None when absent.

        Raises ReceiptInvalid("NOT_REGULAR") for a symlink or a non-regular file: those are
        quarantined like any other bad receipt.
        """
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        try:
            fd = os.open(self.path_of(attempt_id), flags)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ReceiptInvalid("NOT_REGULAR") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ReceiptInvalid("NOT_REGULAR")
            chunks: list[bytes] = []
            remaining = RECEIPT_MAX_BYTES + 1
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def quarantine(self, attempt_id: str) -> bool:
        """Move the receipt into the private quarantine shard; True when it is there now.

        Replays safely: a link left by an interrupted move is recognised (same inode) and the
        original is then unlinked; a different file already in quarantine is never replaced.
        """
        src = self.path_of(attempt_id)
        dst = self.root / quarantine_relpath(attempt_id)
        self.ensure_root()
        if _private_dir(dst.parent):
            fsync_dir(dst.parent.parent)
        try:
            src_st = os.lstat(src)
        except FileNotFoundError:
            return dst.exists()
        return move_by_link(src, dst, src_st)

    def remove(self, attempt_id: str) -> None:
        """Delete a consumed receipt (missing is fine), without an fsync of its shard.

        While the journal row indexes the file, an unlink lost to a power cut only brings the
        receipt back for retention to remove again; retention makes the removals durable
        (``sync_removed``) before it deletes the rows. Per run, that is one flush fewer.
        """
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path_of(attempt_id))
        self.remove_temps(attempt_id)

    def remove_temps(self, attempt_id: str) -> None:
        """Delete the shim's temp files of the attempt, if any (its journal entry is settled).

        Called only once the attempt's ending is committed or its entry is past retention,
        when no shim can still be publishing (a shim that finds its temp gone at ``link()``
        publishes nothing, see api-schemas/launch-protocol.md §3). No fsync: a temp that
        comes back after a power cut is removed again by retention, or by the audit.
        """
        paths = [self.root / receipt_temp_relpath(attempt_id)]
        if self.logs_root is not None:
            paths.append(self.logs_root / truncation_fact_temp_relpath(attempt_id))
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def sync_removed(self, attempt_ids: Sequence[str]) -> None:
        """fsync the shard of each attempt once, whether its receipt went now or earlier."""
        for shard in sorted({self.path_of(a).parent for a in attempt_ids}):
            with contextlib.suppress(FileNotFoundError):
                fsync_dir(shard)

    def remove_quarantined(self, attempt_id: str) -> None:
        """Delete a quarantined receipt after its retention (missing is fine)."""
        self.remove_temps(attempt_id)
        path = self.root / quarantine_relpath(attempt_id)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        fsync_dir(path.parent)

    def claim_reservation(self, attempt_id: str) -> ReservationState:
        """Take the shim's receipt reservation name first, or say who holds it.

        ``fenced``: the name is recovery's (created now with O_EXCL, or by an earlier pass):
        no shim can reserve it any more, so none can start the job. Otherwise a shim reserved
        it and wrote its identity there before it started anything: ``shim_alive`` when that
        exact shim (boot id, pid, start ticks) lives, ``shim_gone`` when it does not,
        ``empty`` when nothing is written yet (the shim created the name and has not written
        its identity, or died there), ``unreadable`` when the bytes are no identity (the
        receipt being published over them, or gone meanwhile). The file stays either way;
        the journal's cleanup removes it.
        """
        self.ensure_shard(attempt_id)
        path = self.root / receipt_temp_relpath(attempt_id)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            return self._holder(path)
        try:
            os.write(fd, FENCE_MARK)  # no fsync: a power cut ends every shim of this boot too
        finally:
            os.close(fd)
        return "fenced"

    def sweep_spares(self) -> int:
        """Remove the root's ``.spare-*.tmp`` files that hold no live shim's claim (a spare
        killed before its launch, or between linking its reservation into place and
        removing its own name, or one still writing it); how many. A live spare's file is
        kept: it removes its own."""
        removed = 0
        try:
            names = [n for n in os.listdir(self.root) if _SPARE.fullmatch(n)]
        except OSError:
            return 0
        for name in names:
            path = self.root / name
            try:
                raw = _read_head(path)
            except OSError:
                continue  # gone meanwhile, or a symlink: not ours to judge
            if raw is None:
                continue  # not a plain file: not a spare's
            claim = _shim_claim(raw)
            if claim is not None and _alive(*claim):
                continue
            # Dead, or still empty (a spare that died, or one writing it now: it then
            # finds its name gone at its launch and reserves the ordinary way).
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
        return removed

    def _holder(self, path: Path) -> ReservationState:
        try:
            raw = _read_head(path)
        except FileNotFoundError:
            return "unreadable"  # published or discarded meanwhile: the next pass sees which
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "unreadable"
            raise
        if raw is None:
            return "unreadable"
        if raw == FENCE_MARK:
            return "fenced"
        if not raw:
            return "empty"
        claim = _shim_claim(raw)
        if claim is None:
            return "unreadable"
        return "shim_alive" if _alive(*claim) else "shim_gone"


# A spare's reservation made ahead: ``.spare-<pid>-<start ticks>.tmp`` (shim.py).
_SPARE = re.compile(r"\.spare-[0-9]+-[0-9]+\.tmp")


def _read_head(path: Path) -> bytes | None:
    """A regular file's bytes up to the receipt limit, trailing zeros dropped; None for
    anything else. OSError when it cannot be opened (gone, a symlink)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.pread(fd, RECEIPT_MAX_BYTES, 0).rstrip(b"\0")
    finally:
        os.close(fd)


def _alive(boot_id: str, pid: int, start_ticks: int) -> bool:
    """That exact shim (this boot, its pid, its start ticks) lives."""
    return boot_id == current_boot_id() and runs(pid, start_ticks)


def _shim_claim(raw: bytes) -> tuple[str, int, int] | None:
    """(boot id, shim pid, shim start ticks) of a shim's reservation, or None."""
    try:
        data: Any = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or set(data) != {"boot_id", "shim_pid", "shim_start_ticks"}:
        return None
    boot_id, pid, ticks = data["boot_id"], data["shim_pid"], data["shim_start_ticks"]
    if not (isinstance(boot_id, str) and type(pid) is int and type(ticks) is int and pid > 0):
        return None
    return boot_id, pid, ticks
