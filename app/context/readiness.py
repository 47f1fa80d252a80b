"""Readiness: named checks run concurrently, answered within a fixed deadline (docs/api.md §3).

A check returns None when fine or a short reason. Each runs on a small private pool; the
probe waits at most ``deadline_s`` in all, and a check still running then is reported as
not answering in time (a SIGSTOPped worker, a hung database connection) instead of holding
the answer. A check still running from an earlier probe is waited on again, never started
twice, so a hung check costs one thread however often the probe is asked.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from sqlalchemy import Engine, text

from app.context.facade import Readiness
from app.domain.profiles import MIB, RECEIPTS_BYTES_TO_START
from app.storage.migrate import current_revision, head_revision, is_known
from app.storage.unavailable import WRITE_HEALTH

ReadyCheck = Callable[[], str | None]
# Under the 1 s a probe of /readyz may take, with room for the HTTP round trip.
DEFAULT_DEADLINE_S = 0.6


class ReadinessProbe:
    """Runs the checks concurrently; ``__call__`` answers within the deadline."""

    def __init__(
        self,
        checks: Mapping[str, ReadyCheck],
        *,
        deadline_s: float,
        facts: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._checks = dict(checks)
        # Read after the checks: what they learnt (the worker's process limit, from its ping).
        self._facts = facts
        self._deadline_s = deadline_s
        self._pool = ThreadPoolExecutor(max(1, len(self._checks)), thread_name_prefix="ql-ready")
        self._running: dict[str, Future[str]] = {}
        self._lock = threading.Lock()

    def __call__(self) -> Readiness:
        """Every check's outcome (``ok`` or a reason); ready when all are ``ok``."""
        with self._lock:
            for name, check in self._checks.items():
                running = self._running.get(name)
                if running is None or running.done():
                    self._running[name] = self._pool.submit(_outcome, check)
            futures = dict(self._running)
        wait(futures.values(), timeout=self._deadline_s)
        late = f"did not answer within {self._deadline_s:g} s"
        results = {name: f.result() if f.done() else late for name, f in futures.items()}
        facts = self._facts() if self._facts is not None else {}
        return Readiness(
            ready=all(v == "ok" for v in results.values()), checks=results, facts=facts
        )

    def close(self) -> None:
        """Stop the pool without waiting for a hung check."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _outcome(check: ReadyCheck) -> str:
    try:
        return check() or "ok"
    except Exception as exc:
        return f"check failed ({type(exc).__name__})"


def database_check(engine: Engine) -> str | None:
    """None when the database answers, is at the newest migration and takes writes."""
    try:
        current = current_revision(engine)
        read_only = _pg_read_only(engine)
    except Exception as exc:  # any driver error means "not reachable" to a probe
        return f"database unreachable ({type(exc).__name__})"
    if current != head_revision():
        if current is not None and not is_known(current):  # no second database read
            return (
                f"database is at migration {current}, newer than this build knows "
                f"(its newest is {head_revision()})"
            )
        return "database is not migrated to head (run `qinglong migrate`)"
    if read_only:
        return "database is read-only (a standby, or transaction_read_only is on)"
    if WRITE_HEALTH.refusing(engine):
        return "database cannot commit writes (disk full or read-only)"
    return None


def _pg_read_only(engine: Engine) -> bool:
    if engine.dialect.name != "postgresql":
        return False  # SQLite: its file system is the disk check's (and a refused write's)
    with engine.connect() as conn:
        return conn.execute(text("SHOW transaction_read_only")).scalar() == "on"


def disk_check(
    data_dir: str | os.PathLike[str],
    reserve_bytes: int,
    *,
    logs_dir: str | os.PathLike[str] | None = None,
    bytes_to_start: int = 0,
    receipts_dir: str | os.PathLike[str] | None = None,
) -> str | None:
    """None when the data dir is writable and holds more free space than the reserve, and,
    given ``logs_dir``, when the dispatcher's disk admission would let a run start there
    (``Profile.free_bytes_to_start``, the rule app/execution/materializer.py applies) and,
    given ``receipts_dir``, when that takes a receipt (not read-only, at least
    ``RECEIPTS_BYTES_TO_START`` free); else why not. Runs that cannot start wait queued: an
    operator alerting on /readyz sees it."""
    try:
        st = os.statvfs(data_dir)
    except OSError as exc:
        return f"data dir not usable (errno {exc.errno})"
    if st.f_flag & os.ST_RDONLY:
        return "data dir is on a read-only file system"
    free = st.f_bavail * st.f_frsize
    if free < reserve_bytes:
        return (
            f"free space in the data dir below the profile reserve "
            f"({free // MIB} MiB < {reserve_bytes // MIB} MiB)"
        )
    if logs_dir is None:
        return None
    # logs/ and receipts/ may be file systems of their own (before the first run they may
    # not exist yet: the data dir's figures stand for them).
    logs = _room(
        logs_dir, st, "job logs", bytes_to_start, "the reserve plus one log's quota", "MiB"
    )
    if logs is not None or receipts_dir is None:
        return logs
    need = RECEIPTS_BYTES_TO_START
    return _room(receipts_dir, st, "receipts", need, f"{need // MIB} MiB", "KiB")


_UNITS = {"MiB": MIB, "KiB": 1024}


def _room(
    path: str | os.PathLike[str],
    fallback: os.statvfs_result,
    what: str,
    need: int,
    need_words: str,
    unit: str,
) -> str | None:
    """Why runs wait for ``what`` on ``path`` (read-only, or less than ``need`` free; the
    dispatcher's own rule), or None; sizes in ``unit``."""
    try:
        st = os.statvfs(path)
    except OSError:
        st = fallback
    if st.f_flag & os.ST_RDONLY:
        return f"{what} are on a read-only file system: queued runs wait"
    free = st.f_bavail * st.f_frsize
    if free < need:
        size = _UNITS[unit]
        return (
            f"free space for {what} below {need_words} "
            f"({free // size} {unit} < {need // size} {unit}): queued runs wait"
        )
    return None
