"""``qinglong serve --stop-jobs-on-exit``: stop the running jobs, and record their endings.

By default a shutdown leaves jobs running (their shims are detached) and the worker
reconciles them at its next start. With the flag, once the api is down (nothing new
launches) and before the worker is told to stop, ``stop_through_worker`` asks this serve's
worker (pid) whether it holds its lease, on a thread of its own (the supervisor's loop never
waits on the database); if it does, each of this host's active attempts
gets a cancel intent (reason ``user``; like every reason but ``timeout`` its ending maps to
``cancelled``, never retried) and the worker is woken: its cancellation sweep stops each job
by exact identity (docs/design.md §3.10: TERM, grace, identity re-check, KILL; a mismatched
identity is never signalled) and it records each ending from the shim's receipt, as for a
user's cancel. The supervisor waits for that in its loop, bounded, then stops the worker.
Nothing here signals a job while the worker runs: one stopper, one count.

What that left (the worker was down or did not hold its lease, an ending not recorded in
time) ``stop_active_jobs`` stops after the services are down, holding this host's lease for
the while (a live worker holding it, of this data dir or on SQLite of another, leaves its
jobs alone); those endings are recorded at this host's next start, as before the flag
changed (a warning says how many).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from sqlalchemy import Engine

from app.adapters.worker_client import WorkerClient
from app.domain.errors import DomainError, LeaseHeld, WorkerUnavailable
from app.domain.model import ProcessHandle
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.lease_repo import LeaseRepository, several_hosts
from app.storage.run_reads import ActiveAttempt, RunReader
from app.storage.runs_repo import RunRepository
from app.worker.cgroups import CgroupRoot, detect
from app.worker.identity import wait_exit
from app.worker.instance import claimant, holder_alive, instance_id
from app.worker.launcher import stop_handle
from app.worker.watcher import shim_alive

_PAGE = 100
_PARALLEL = 16
_SHIM_WAIT_S = 5.0
# Past the jobs' stop grace: for the worker to kill the stragglers and record every ending.
RECORD_MARGIN_S = 10.0
_PING_S = 2.0
_LOOK_S = 0.1  # how often the thread looks whether the asked jobs' endings are recorded
# "user", though no user asked: builds before this one answer 500 for a reason they do not
# know, so ``service_stop`` (read since this build) is written only once a rollback to them
# is no longer supported (docs/operations.md §4). Meanwhile the ``run.cancel_requested``
# event carries ``"service_stop": true``, which the web UI reads (docs/ui.md).
SERVICE_STOP_REASON: Final = "user"
log = logging.getLogger("qinglong.supervisor")


def stop_active_jobs(settings: Settings) -> Counter[str]:
    """Cancel and stop every starting/running attempt of this host, holding its lease for the
    while (taken at once when this host's worker is gone; refused while a live worker, of
    this data dir or, on SQLite, of another, holds it: then nothing is touched, ``held``);
    returns counts by outcome."""
    engine = make_engine(settings.database_url)
    counts: Counter[str] = Counter()
    try:
        leases = LeaseRepository(engine)
        grace = settings.profile.stop_grace_s
        try:
            lease = leases.take(
                claimant=claimant(settings.data_dir), holder_alive=holder_alive,
                ttl_ms=round((settings.lease_ttl_s + grace + _SHIM_WAIT_S) * 1000),
            )  # fmt: skip
        except LeaseHeld:
            counts["held"] = 1
            return counts
        try:
            _, active = _cancel_active(settings, engine)
            root = detect(settings.cgroup_root)
            with ThreadPoolExecutor(max_workers=_PARALLEL) as pool:
                results = pool.map(lambda a: _stop_one(a.handle, grace, root), active)
                counts.update(results)
        finally:
            leases.release(instance_id=lease.instance_id, epoch=lease.epoch)
    finally:
        engine.dispose()
    return counts


class ThroughWorker:
    """What ``stop_through_worker`` began, on a thread of its own so the supervisor's loop
    never waits on the database or the socket: ask the worker ``worker_pid`` whether it holds
    its lease; if so, cancel this host's active attempts, wake it, and follow them until none
    is active. ``done`` and ``close`` only read what the thread found."""

    def __init__(self, settings: Settings, worker_pid: int) -> None:
        self._settings, self._pid = settings, worker_pid
        # The ping, the stop grace for the jobs, the margin for the worker to record them.
        self.deadline = time.monotonic() + _PING_S + settings.profile.stop_grace_s
        self.deadline += RECORD_MARGIN_S
        self._over, self._closed = threading.Event(), threading.Event()
        self._asked: int | None = None  # None: the worker did not answer holding its lease
        self._left = 0
        self._failed: str | None = None
        self._thread = threading.Thread(target=self._run, name="ql-stop-jobs", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        """True once it is over: nothing to do, or every asked job's ending is recorded."""
        return self._over.is_set()

    def close(self, *, finished: bool) -> None:
        """Say what became of the jobs (the thread ends at its next look)."""
        self._closed.set()
        if self._failed is not None:
            log.warning("stop-jobs-on-exit: stopping through the worker failed (%s)", self._failed)
        if self._asked is None:
            if self._failed is None:
                log.info(
                    "stop-jobs-on-exit: the worker did not answer holding its lease; its jobs "
                    "are stopped after it, if this host may"
                )
            return
        left = 0 if finished and self._failed is None else self._left
        log.info(
            "stop-jobs-on-exit: asked the worker to stop %d job(s); %d recorded",
            self._asked, self._asked - left,
        )  # fmt: skip
        if left:
            log.warning(
                "stop-jobs-on-exit: %d ending(s) not recorded before the worker stops: they "
                "are stopped after it, and recorded at this host's next start",
                left,
            )

    def _run(self) -> None:
        engine: Engine | None = None
        client = WorkerClient(
            self._settings.socket_path, connect_timeout_s=_PING_S, read_timeout_s=_PING_S,
            retries=0,
        )  # fmt: skip
        try:
            try:
                answer = client.ping(timeout_s=_PING_S)
            except WorkerUnavailable:
                return  # down, starting, or without its lease: the stop after it decides
            if answer.get("pid") != self._pid:
                return  # not this serve's worker (a stale socket): nothing is touched
            engine = make_engine(self._settings.database_url)
            reader, active = _cancel_active(self._settings, engine)
            ids = [a.attempt_id for a in active]
            self._left = len(ids)
            self._asked = len(ids)
            if ids:
                client.wake()  # the cancellation sweep now, not in up to half a second
            while self._left and not self._closed.wait(_LOOK_S):
                self._left = sum(
                    len(reader.active_among(ids[i : i + _PAGE])) for i in range(0, len(ids), _PAGE)
                )
        except Exception as exc:  # the stop goes on; what is left is stopped after the worker
            self._failed = type(exc).__name__
        finally:
            client.close()
            if engine is not None:
                engine.dispose()
            self._over.set()


def stop_through_worker(settings: Settings, worker_pid: int) -> ThroughWorker:
    """Begin the stop of this host's jobs through its running worker (``ThroughWorker``)."""
    return ThroughWorker(settings, worker_pid)


def _cancel_active(settings: Settings, engine: Engine) -> tuple[RunReader, list[ActiveAttempt]]:
    """A cancel intent on each of this host's starting or running attempts; those attempts."""
    reader, runs = _reader(settings, engine), RunRepository(engine)
    active = _active(reader)
    for attempt in active:
        with contextlib.suppress(DomainError):  # ended meanwhile: nothing to cancel
            # Its attempt only: if it ended meanwhile and a retry waits, that retry stays.
            runs.request_cancel(
                run_id=attempt.run_id, reason=SERVICE_STOP_REASON,
                attempt_id=attempt.attempt_id, service_stop=True,
            )  # fmt: skip
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
