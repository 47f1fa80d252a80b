"""``qinglong serve --stop-jobs-on-exit``: stop the running jobs, and record their endings.

By default a shutdown leaves jobs running (their shims are detached) and the worker
reconciles them at its next start. With the flag, once the api is down (nothing new
launches) and before the worker is told to stop, ``stop_through_worker`` asks this serve's
worker (pid) whether it holds its lease; if it does, each of this host's active attempts
gets a cancel intent (reason ``user``; like every reason but ``timeout`` its ending maps to
``cancelled``, never retried) and the worker is woken: its cancellation sweep stops each job
by exact identity (docs/design.md §3.10: TERM, grace, identity re-check, KILL; a mismatched
identity is never signalled) and it records each ending from the shim's receipt, as for a
user's cancel. The supervisor waits for that in its loop, bounded, then stops the worker.
Nothing here signals a job while the worker runs: one stopper, one count.

What that left (the worker was down or did not hold its lease, an ending not recorded in
time) ``stop_active_jobs`` stops after the services are down; those endings are recorded at
this host's next start, as before the flag changed (a warning says how many).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from sqlalchemy import Engine

from app.adapters.worker_client import WorkerClient
from app.domain.errors import DomainError, WorkerUnavailable
from app.domain.model import ProcessHandle
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.lease_repo import several_hosts
from app.storage.run_reads import ActiveAttempt, RunReader
from app.storage.runs_repo import RunRepository
from app.worker.cgroups import CgroupRoot, detect
from app.worker.identity import wait_exit
from app.worker.instance import instance_id
from app.worker.launcher import stop_handle
from app.worker.watcher import shim_alive

_PAGE = 100
_PARALLEL = 16
_SHIM_WAIT_S = 5.0
# Past the jobs' stop grace: for the worker to kill the stragglers and record every ending.
RECORD_MARGIN_S = 10.0
_PING_S = 2.0
# "user", though no user asked: builds before this one answer 500 for a reason they do not
# know, so ``service_stop`` (read since this build) is written only once a rollback to them
# is no longer supported (docs/operations.md §4).
SERVICE_STOP_REASON: Final = "user"
log = logging.getLogger("qinglong.supervisor")


def stop_active_jobs(settings: Settings) -> Counter[str]:
    """Cancel and stop every starting/running attempt; returns counts by outcome."""
    engine = make_engine(settings.database_url)
    counts: Counter[str] = Counter()
    try:
        _, active = _cancel_active(settings, engine)
        grace = settings.profile.stop_grace_s
        root = detect(settings.cgroup_root)
        with ThreadPoolExecutor(max_workers=_PARALLEL) as pool:
            results = pool.map(lambda a: _stop_one(a.handle, grace, root), active)
            counts.update(results)
    finally:
        engine.dispose()
    return counts


class ThroughWorker:
    """The jobs this serve's running worker was asked to stop, until it recorded them."""

    def __init__(self, engine: Engine, reader: RunReader, attempt_ids: list[str], wait_s: float):
        self.deadline = time.monotonic() + wait_s
        self._engine, self._reader, self._ids = engine, reader, attempt_ids
        self._left = len(attempt_ids)

    def done(self) -> bool:
        """True once none of them is starting or running any more."""
        self._left = sum(
            len(self._reader.active_among(self._ids[i : i + _PAGE]))
            for i in range(0, len(self._ids), _PAGE)
        )
        return self._left == 0

    def close(self, *, finished: bool) -> None:
        """Say what became of them; release the engine."""
        self._engine.dispose()
        if finished:
            self._left = 0
        log.info(
            "stop-jobs-on-exit: %d job(s) stopped through the worker, %d recorded",
            len(self._ids), len(self._ids) - self._left,
        )  # fmt: skip
        if self._left:
            log.warning(
                "stop-jobs-on-exit: %d ending(s) not recorded before the worker stops: they "
                "are stopped after it, and recorded at this host's next start",
                self._left,
            )


def stop_through_worker(settings: Settings, worker_pid: int) -> ThroughWorker | None:
    """Cancel this host's active attempts and wake the worker ``worker_pid`` to stop and
    record them, if it answers holding its lease; None (nothing touched) otherwise."""
    client = WorkerClient(
        settings.socket_path, connect_timeout_s=_PING_S, read_timeout_s=_PING_S, retries=0
    )
    try:
        try:
            answer = client.ping(timeout_s=_PING_S)
        except WorkerUnavailable:
            return None  # down, starting, or without its lease: the stop after it decides
        if answer.get("pid") != worker_pid:
            return None
        engine = make_engine(settings.database_url)
        try:
            reader, active = _cancel_active(settings, engine)
        except BaseException:
            engine.dispose()
            raise
        if not active:
            engine.dispose()
            log.info("stop-jobs-on-exit: none active")
            return None
        client.wake(reconcile=True)  # at once; its own sweep would within half a second
        wait_s = settings.profile.stop_grace_s + RECORD_MARGIN_S
        return ThroughWorker(engine, reader, [a.attempt_id for a in active], wait_s)
    finally:
        client.close()


def _cancel_active(settings: Settings, engine: Engine) -> tuple[RunReader, list[ActiveAttempt]]:
    """A cancel intent on each of this host's starting or running attempts; those attempts."""
    reader, runs = _reader(settings, engine), RunRepository(engine)
    active = _active(reader)
    for attempt in active:
        with contextlib.suppress(DomainError):  # ended meanwhile: nothing to cancel
            runs.request_cancel(run_id=attempt.run_id, reason=SERVICE_STOP_REASON)
    return reader, active


def _reader(settings: Settings, engine: Engine) -> RunReader:
    # Several hosts (docs/several-hosts.md): only this host's attempts.
    own = instance_id(settings.data_dir) if several_hosts(engine) else None
    return RunReader(engine, worker_instance_id=own)


def _active(reader: RunReader) -> list[ActiveAttempt]:
    active: list[ActiveAttempt] = []
    after: str | None = None
    while True:
        page = reader.active_attempts(limit=_PAGE, after_id=after)
        active.extend(page)
        if len(page) < _PAGE:
            return active
        after = page[-1].attempt_id


def _stop_one(handle: ProcessHandle | None, grace_s: float, root: CgroupRoot | None) -> str:
    if handle is None:
        return "no_handle"  # never reached running: the reconciler settles it
    result = stop_handle(handle, grace_seconds=grace_s, cgroup_root=root)
    if shim_alive(handle):  # the boot id too: after a reboot the pid may be anyone's
        wait_exit(handle.shim_pid, _SHIM_WAIT_S)  # let it publish the receipt
    return result
