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
partial listing can never be mistaken for the whole. Output: the window, the entries found,
counts and ``next shard``.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.shard_audit import (
    AuditReport,
    add_audit_flags,
    cutoff_of,
    move_to_quarantine,
    run_audit,
    shard_dir,
    shards_of_window,
)
from app.domain.artifacts import RECEIPT_SUFFIX, published_by_temp, shard_of
from app.domain.ids import UUID7_PATTERN

if TYPE_CHECKING:
    from app.storage.journal_repo import JournalRepository
    from app.storage.run_reads import RunReader

_RECEIPT = re.compile(rf"^({UUID7_PATTERN}){re.escape(RECEIPT_SUFFIX)}$")


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


def cmd_audit(args: argparse.Namespace) -> int:
    """Run one bounded audit window and print counts and the next shard cursor."""
    from app.storage.journal_repo import JournalRepository
    from app.storage.run_reads import RunReader

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
    report = AuditReport()
    cutoff = cutoff_of(min_age_s, now)
    for real_root, shard, entries, overflow in shards_of_window(
        report, root, start=start, shards=shards, per_shard=per_shard, scan=_scan
    ):
        for entry in entries:
            verdict = _classify(entry, journal, reader, cutoff)
            report.counts[verdict] += 1
            if verdict == "eligible" and quarantine and not overflow:
                report.moved_or_skipped(
                    move_to_quarantine(real_root, shard, entry.name, entry.inode)
                )
    return report


def _scan(real_root: Path, shard: str, limit: int) -> list[_Entry] | None:
    """At most ``limit`` entries of one shard, incrementally, without reading any file."""
    path = shard_dir(real_root, shard)
    if path is None:
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
