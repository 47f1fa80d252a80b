"""``qinglong receipts audit``: bounded audit of receipt files the journal does not index.

docs/design.md §3.15. The runtime never lists the receipt shards (only the root, once at the
worker's start, for spares' reservations made ahead); this separate maintenance command does,
within hard bounds: a window of shards from an explicit cursor (default 8,
at most 32), at most ``--per-shard`` entries each (default 32, at most 64), incremental
``os.scandir``, file contents never read, database read-only. A receipt the journal knows
or whose attempt is still active is never moved. Unregistered receipts, temp files and
unknown regular files older than ``--min-age-s`` are *eligible*; only ``--quarantine``
moves them, by hard link + unlink into a private 0700 ``.orphan-quarantine`` (no deletion
is offered). Symlinks, directories and other types are reported ``unsafe``. A shard with
more than ``--per-shard`` entries is ``overflow``: nothing in it moves this round, so a
partial listing can never be mistaken for the whole. Output: counts and ``next shard``.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from app.cli.common import database
from app.domain.artifacts import RECEIPT_SUFFIX, published_by_temp, shard_of
from app.domain.ids import UUID7_PATTERN
from app.settings import Settings
from app.storage.durable import move_by_link
from app.storage.journal_repo import JournalRepository
from app.storage.run_reads import RunReader

SHARD_COUNT = 256
DEFAULT_SHARDS, MAX_SHARDS = 8, 32
DEFAULT_PER_SHARD, MAX_PER_SHARD = 32, 64
DEFAULT_MIN_AGE_S = 3600.0
ORPHAN_DIR = ".orphan-quarantine"
_RECEIPT = re.compile(rf"^({UUID7_PATTERN}){re.escape(RECEIPT_SUFFIX)}$")


class AuditRefused(Exception):
    """The receipts root or a directory under it is not what it must be (fail closed)."""


@dataclass
class AuditReport:
    """Counts per classification, plus what moved and which shards overflowed."""

    counts: Counter[str] = field(default_factory=Counter)
    moved: int = 0
    overflow: list[str] = field(default_factory=list)
    next_shard: str = "00"


@dataclass(frozen=True)
class _Entry:
    name: str
    kind: str  # receipt | temp | other | unsafe
    attempt_id: str | None
    inode: int
    mtime: float


def register(sub: Any) -> None:
    """Add ``receipts audit`` to the parser."""
    receipts = sub.add_parser("receipts", help="receipt file maintenance")
    rsub = receipts.add_subparsers(dest="receipts_command", metavar="ACTION", required=True)
    audit = rsub.add_parser("audit", help="bounded audit of unindexed receipt files")
    add_audit_flags(audit)
    audit.set_defaults(handler=cmd_audit)


def add_audit_flags(audit: Any) -> None:
    """The flags of one bounded audit window, shared by ``receipts audit`` and ``logs audit``."""
    audit.add_argument(
        "--quarantine",
        action="store_true",
        help="move eligible files into .orphan-quarantine (default: report only)",
    )
    audit.add_argument("--shard", default="00", help="first shard, two hex digits (cursor)")
    audit.add_argument(
        "--shards", type=int, default=DEFAULT_SHARDS, help=f"shards to audit (1..{MAX_SHARDS})"
    )
    audit.add_argument(
        "--per-shard",
        type=int,
        default=DEFAULT_PER_SHARD,
        help=f"entries per shard (1..{MAX_PER_SHARD})",
    )
    audit.add_argument(
        "--min-age-s",
        type=float,
        default=DEFAULT_MIN_AGE_S,
        help="only files older than this are eligible",
    )


def audit_window(args: argparse.Namespace) -> int:
    """The first shard of the window the flags name; ValueError names a flag out of bounds."""
    start = _parse_shard(args.shard)
    if not 1 <= args.shards <= MAX_SHARDS:
        raise ValueError(f"--shards must be between 1 and {MAX_SHARDS}")
    if not 1 <= args.per_shard <= MAX_PER_SHARD:
        raise ValueError(f"--per-shard must be between 1 and {MAX_PER_SHARD}")
    if not args.min_age_s >= 0:
        raise ValueError("--min-age-s must be zero or more")
    return start


def cmd_audit(args: argparse.Namespace) -> int:
    """Run one bounded audit window and print counts and the next shard cursor."""
    return run_audit(
        args,
        "receipts",
        lambda settings, engine, window: audit(
            root=settings.receipts_dir,
            journal=JournalRepository(engine),
            reader=RunReader(engine),
            **window,
        ),
    )


def run_audit(
    args: argparse.Namespace,
    what: str,
    audit_one: Callable[[Settings, Engine, dict[str, Any]], AuditReport],
) -> int:
    """Both audit commands: check the window's flags, audit it on the service's database
    (``audit_one(settings, engine, window)``, the window being the keyword arguments start,
    shards, per_shard, min_age_s and quarantine), print the report; 1 when refused."""
    window = {
        "start": audit_window(args), "shards": args.shards, "per_shard": args.per_shard,
        "min_age_s": args.min_age_s, "quarantine": args.quarantine,
    }  # fmt: skip
    try:
        with database(args) as (settings, engine):
            report = audit_one(settings, engine, window)
    except AuditRefused as exc:
        print(f"qinglong: {what} audit refused: {exc}", file=sys.stderr)
        return 1
    print_report(report, quarantine=args.quarantine)
    return 0


def print_report(report: AuditReport, *, quarantine: bool) -> None:
    """One audit window's counts and the next shard cursor, as both audit commands print them."""
    for name in sorted(report.counts):
        print(f"{name}: {report.counts[name]}")
    if quarantine:
        print(f"moved: {report.moved}")
    if report.overflow:
        print(f"overflow shards: {' '.join(report.overflow)}")
    print(f"next shard: {report.next_shard}")


def _parse_shard(text: str) -> int:
    if not re.fullmatch(r"[0-9a-fA-F]{2}", text):
        raise ValueError("--shard must be two hex digits (00..ff)")
    return int(text, 16)


def audit(
    *,
    root: Path,
    journal: JournalRepository,
    reader: RunReader,
    start: int,
    shards: int,
    per_shard: int,
    min_age_s: float,
    quarantine: bool,
    now: float | None = None,
) -> AuditReport:
    """Classify (and optionally quarantine) one bounded window of shards."""
    report = AuditReport(next_shard=f"{(start + shards) % SHARD_COUNT:02x}")
    real_root = _checked_root(root)
    if real_root is None:
        return report  # no receipts root yet: nothing to audit
    cutoff = (time.time() if now is None else now) - min_age_s
    for i in range(shards):
        shard = f"{(start + i) % SHARD_COUNT:02x}"
        entries = _scan(real_root, shard, per_shard + 1)
        if entries is None:
            continue
        overflow = len(entries) > per_shard
        if overflow:
            report.overflow.append(shard)
            entries = entries[:per_shard]
        for entry in entries:
            verdict = _classify(entry, journal, reader, cutoff)
            report.counts[verdict] += 1
            if verdict == "eligible" and quarantine and not overflow:
                if _move(real_root, shard, entry):
                    report.moved += 1
                else:
                    report.counts["move_skipped"] += 1
    return report


def _checked_root(root: Path) -> Path | None:
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        raise AuditRefused("the receipts root is not a directory (symlinks are refused)")
    return Path(os.path.realpath(root))


def _under_root(real_root: Path, path: Path) -> bool:
    """``path`` is a real directory (not a symlink) whose canonical parent is the root."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise AuditRefused(f"{path.name} under the receipts root is not a directory")
    if Path(os.path.realpath(path)).parent != real_root:
        raise AuditRefused(f"{path.name} escapes the receipts root")
    return True


def _scan(real_root: Path, shard: str, limit: int) -> list[_Entry] | None:
    """At most ``limit`` entries of one shard, incrementally, without reading any file."""
    path = real_root / shard
    if not _under_root(real_root, path):
        return None
    out: list[_Entry] = []
    with os.scandir(path) as it:
        for dent in it:
            st = dent.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                out.append(_Entry(dent.name, "unsafe", None, st.st_ino, st.st_mtime))
            elif m := _RECEIPT.match(dent.name):
                attempt = m.group(1) if shard_of(m.group(1)) == shard else None
                out.append(
                    _Entry(
                        dent.name,
                        "receipt" if attempt else "other",
                        attempt,
                        st.st_ino,
                        st.st_mtime,
                    )
                )
            elif m := _RECEIPT.match(published_by_temp(dent.name) or ""):
                # The shim's temp of a receipt (reserved, or published meanwhile).
                out.append(_Entry(dent.name, "temp", m.group(1), st.st_ino, st.st_mtime))
            else:
                out.append(_Entry(dent.name, "other", None, st.st_ino, st.st_mtime))
            if len(out) >= limit:
                break
    return out


def _classify(entry: _Entry, journal: JournalRepository, reader: RunReader, cutoff: float) -> str:
    if entry.kind == "unsafe":
        return "unsafe"
    if entry.attempt_id is not None:
        if journal.get(entry.attempt_id) is not None:
            return "registered"  # the journal owns it: never moved here
        if reader.active_attempt(entry.attempt_id) is not None:
            return "active"  # upgrade protection: never moved while the attempt runs
    if entry.mtime > cutoff:
        return "young"  # publication / cleanup race protection
    return "eligible"


def _move(real_root: Path, shard: str, entry: _Entry) -> bool:
    """Hard-link into the private orphan quarantine, then unlink; never replace anything."""
    qroot = real_root / ORPHAN_DIR
    qshard = qroot / shard
    for d in (qroot, qshard):
        try:
            os.mkdir(d, 0o700)
            os.chmod(d, 0o700)
        except FileExistsError:
            pass
        _under_root(real_root if d == qroot else qroot.resolve(), d)
    src, dst = real_root / shard / entry.name, qshard / entry.name
    try:
        st = os.lstat(src)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_ino != entry.inode:
        return False  # changed since the scan: leave it for the next round
    return move_by_link(src, dst, st)
