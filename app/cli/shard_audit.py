"""What ``qinglong receipts audit`` and ``qinglong logs audit`` share: one bounded window.

docs/design.md §3.15, docs/retention.md §6. Both walk a window of the 256 shards of a root
(``--shard`` the cursor, ``--shards`` how many, at most ``--per-shard`` entries each, listed
incrementally, nothing read), refuse a root or shard that is not a real directory under it
(fail closed), report a shard with more entries than the bound as ``overflow`` (nothing in it
moves this round) and move an eligible file only by hard link + unlink into the root's private
0700 ``.orphan-quarantine``. Each command brings its own scan and classification
(app/cli/receipts.py, app/cli/logs.py).
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine

from app.cli.common import database
from app.settings import Settings
from app.storage.durable import move_by_link

SHARD_COUNT = 256
DEFAULT_SHARDS, MAX_SHARDS = 8, 32
DEFAULT_PER_SHARD, MAX_PER_SHARD = 32, 64
DEFAULT_MIN_AGE_S = 3600.0
ORPHAN_DIR = ".orphan-quarantine"

Entry = TypeVar("Entry")


class AuditRefused(Exception):
    """The audited root or a directory under it is not what it must be (fail closed)."""


@dataclass
class AuditReport:
    """Counts per classification, plus what moved and which shards overflowed."""

    counts: Counter[str] = field(default_factory=Counter)
    moved: int = 0
    overflow: list[str] = field(default_factory=list)
    next_shard: str = "00"

    def moved_or_skipped(self, moved: bool) -> None:
        """Count one quarantine move, or a file that changed since the scan."""
        if moved:
            self.moved += 1
        else:
            self.counts["move_skipped"] += 1


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
    print_report(report, start=window["start"], shards=args.shards, quarantine=args.quarantine)
    return 0


def print_report(report: AuditReport, *, start: int, shards: int, quarantine: bool) -> None:
    """One audit window's range, counts and next shard cursor, as both audit commands print
    them. ``entries found`` (every class, an overflowed shard's first ``--per-shard`` only) is
    said even when 0, so an empty window reads as checked."""
    last = (start + shards - 1) % SHARD_COUNT
    print(f"shards audited: {start:02x}..{last:02x}")
    print(f"entries found: {report.counts.total() - report.counts['move_skipped']}")
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


def cutoff_of(min_age_s: float, now: float | None) -> float:
    """The newest modification time an eligible file may have."""
    return (time.time() if now is None else now) - min_age_s


def shards_of_window(
    report: AuditReport,
    root: Path,
    *,
    start: int,
    shards: int,
    per_shard: int,
    scan: Callable[[Path, str, int], list[Entry] | None],
) -> Iterator[tuple[Path, str, list[Entry], bool]]:
    """(the root's real path, shard, its entries, overflowed) for each shard of the window
    that exists, ``scan(real_root, shard, limit)`` listing at most ``limit`` entries of one.
    An overflowed shard is reported and yields its first ``per_shard`` entries; no root yet
    yields nothing. Sets the report's next shard."""
    report.next_shard = f"{(start + shards) % SHARD_COUNT:02x}"
    real_root = _checked_root(root)
    if real_root is None:
        return  # nothing written there yet: nothing to audit
    for i in range(shards):
        shard = f"{(start + i) % SHARD_COUNT:02x}"
        entries = scan(real_root, shard, per_shard + 1)
        if entries is None:
            continue
        overflow = len(entries) > per_shard
        if overflow:
            report.overflow.append(shard)
            entries = entries[:per_shard]
        yield real_root, shard, entries, overflow


def _checked_root(root: Path) -> Path | None:
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        raise AuditRefused(f"{root} is not a directory (symlinks are refused)")
    return Path(os.path.realpath(root))


def shard_dir(real_root: Path, shard: str) -> Path | None:
    """The shard's directory to list, or None when it does not exist; AuditRefused when it
    is not a real directory whose canonical parent is the root."""
    path = real_root / shard
    return path if _under_root(real_root, path) else None


def _under_root(real_root: Path, path: Path) -> bool:
    """``path`` is a real directory (not a symlink) whose canonical parent is the root."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise AuditRefused(f"{path.name} under {real_root} is not a directory")
    if Path(os.path.realpath(path)).parent != real_root:
        raise AuditRefused(f"{path.name} escapes {real_root}")
    return True


def move_to_quarantine(real_root: Path, shard: str, name: str, inode: int) -> bool:
    """Hard-link the shard's file ``name`` into the private orphan quarantine, then unlink it;
    never replace anything. False when it changed since the scan (another inode, gone, not a
    regular file): it is left for the next round."""
    qroot = real_root / ORPHAN_DIR
    qshard = qroot / shard
    for d in (qroot, qshard):
        try:
            os.mkdir(d, 0o700)
            os.chmod(d, 0o700)
        except FileExistsError:
            pass
        _under_root(real_root if d == qroot else qroot.resolve(), d)
    src, dst = real_root / shard / name, qshard / name
    try:
        st = os.lstat(src)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_ino != inode:
        return False
    return move_by_link(src, dst, st)
