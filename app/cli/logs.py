"""``qinglong logs audit``: bounded audit of log files no attempt row names (docs/retention.md §6).

The sibling of ``qinglong receipts audit`` (docs/design.md §3.15), with the same bounds: a
window of shards from an explicit cursor (default 8, at most 32), at most ``--per-shard``
entries each (default 32, at most 64), incremental ``os.scandir``, file contents never read,
database read-only. The retention sweep never lists a directory; files it cannot know of
(a restored backup, a crash of a version before retention, rows deleted by hand) are this
command's business.

Classes: ``registered`` (the attempt's row says the log is there), ``expiring`` (the sweep
is between its marks: it finishes the file itself), ``expired_leftover`` (the row says
expired but the file is there: only a crash between the unlink and its fsync, replayed by a
power cut, can leave one), ``orphan`` (no attempt row at all), ``young`` (unregistered but
newer than ``--min-age-s``), ``other`` (a name that is no attempt's), ``unsafe`` (not a
regular file). ``orphan``, ``expired_leftover`` and ``other`` older than the minimum age are
*eligible*; only ``--quarantine`` moves them, by hard link + unlink into a private 0700
``.orphan-quarantine``. It never deletes.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from app.cli.shard_audit import (
    AuditReport,
    add_audit_flags,
    cutoff_of,
    move_to_quarantine,
    run_audit,
    shard_dir,
    shards_of_window,
)
from app.domain.artifacts import shard_of
from app.domain.ids import UUID7_PATTERN

# The log, its truncation fact and the fact's temp: all named by the attempt id.
_LOG_FILE = re.compile(rf"^\.?({UUID7_PATTERN})\.log(\.truncated(\.tmp)?)?$")


def register(sub: Any) -> None:
    """Add ``logs audit`` to the parser."""
    # A run's log is ``runs logs``: said in the usage line, which an error shows too
    # (``qinglong logs RUN`` answered only "invalid choice ... (choose from 'audit')").
    logs = sub.add_parser(
        "logs",
        help="log file maintenance (a run's log: qinglong runs logs RUN)",
        usage="qinglong logs audit [flags]  (a run's log: qinglong runs logs RUN)",
    )
    lsub = logs.add_subparsers(
        dest="logs_command", metavar="ACTION", required=True, prog="qinglong logs"
    )
    audit = lsub.add_parser("audit", help="bounded audit of log files no attempt names")
    add_audit_flags(audit)
    audit.set_defaults(handler=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    """Run one bounded audit window and print counts and the next shard cursor."""
    return run_audit(
        args,
        "logs",
        lambda settings, engine, window: audit(root=settings.logs_dir, engine=engine, **window),
    )


def audit(
    *,
    root: Path,
    engine: Engine,
    start: int,
    shards: int,
    per_shard: int,
    min_age_s: float,
    quarantine: bool,
    now: float | None = None,
) -> AuditReport:
    """Classify (and optionally quarantine) one bounded window of log shards."""
    report = AuditReport()
    cutoff = cutoff_of(min_age_s, now)
    for real_root, shard, entries, overflow in shards_of_window(
        report, root, start=start, shards=shards, per_shard=per_shard, scan=_scan
    ):
        states = _log_states(engine, {a for _, a, _ in entries if a is not None})
        for name, attempt_id, st in entries:
            verdict = _classify(attempt_id, st, states, cutoff)
            report.counts[verdict] += 1
            if verdict in _ELIGIBLE and st.st_mtime <= cutoff and quarantine and not overflow:
                report.moved_or_skipped(move_to_quarantine(real_root, shard, name, st.st_ino))
    return report


_ELIGIBLE = frozenset({"orphan", "expired_leftover", "other"})


def _scan(
    real_root: Path, shard: str, limit: int
) -> list[tuple[str, str | None, os.stat_result]] | None:
    """At most ``limit`` (name, attempt id, lstat) of one shard, without reading any file."""
    path = shard_dir(real_root, shard)
    if path is None:
        return None
    out: list[tuple[str, str | None, os.stat_result]] = []
    with os.scandir(path) as it:
        for dent in it:
            st = dent.stat(follow_symlinks=False)
            m = _LOG_FILE.match(dent.name)
            attempt = m.group(1) if m and shard_of(m.group(1)) == shard else None
            out.append((dent.name, attempt, st))
            if len(out) >= limit:
                break
    return out


def _log_states(engine: Engine, attempt_ids: set[str]) -> dict[str, str]:
    """attempt id → ``present`` / ``expiring`` / ``expired`` for the ids that have a row."""
    from app.storage.tables import attempts

    if not attempt_ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(
            select(attempts.c.id, attempts.c.log_state).where(
                attempts.c.id.in_(sorted(attempt_ids))
            )
        ).all()
    return {r.id: r.log_state or "present" for r in rows}


def _classify(
    attempt_id: str | None, st: os.stat_result, states: dict[str, str], cutoff: float
) -> str:
    if not stat.S_ISREG(st.st_mode):
        return "unsafe"
    if attempt_id is None:
        return "other" if st.st_mtime <= cutoff else "young"
    state = states.get(attempt_id)
    if state == "present":
        return "registered"
    if state == "expiring":
        return "expiring"  # the sweep finishes it: never moved here
    if st.st_mtime > cutoff:
        return "young"
    return "expired_leftover" if state == "expired" else "orphan"
