"""``qinglong serve --stop-jobs-on-exit``: stop the running jobs, and record their endings.

By default a shutdown leaves jobs running (their shims are detached) and the worker
reconciles them at its next start. With the flag, once the api is down (nothing new
launches) and before the worker is told to stop, each active attempt gets a cancel intent
(reason ``user``; like every reason but ``timeout`` its ending maps to ``cancelled``, never
retried) and its job is stopped by exact identity (docs/design.md §3.10: TERM, grace,
identity re-check, KILL; a mismatched identity is never signalled). The shim then publishes
its receipt and exits; the worker, still running, records the ending at once, and the stop
waits for that, bounded, before it stops the worker. Before, the endings were recorded only
at this host's next start: a host stopped for good left its runs ``running`` for ever.
When the worker is not up then, the same stop runs after the services are down, and the
endings are recorded at the next start, as before.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from app.domain.errors import DomainError
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
RECORD_WAIT_S = 10.0  # for the running worker to record the endings of the jobs it stopped
_POLL_S = 0.05
# "user", though no user asked: builds before this one answer 500 for a reason they do not
# know, so ``service_stop`` (read since this build) is written only once a rollback to them
# is no longer supported (docs/operations.md §4).
SERVICE_STOP_REASON: Final = "user"


def stop_active_jobs(settings: Settings, *, record_wait_s: float = 0.0) -> Counter[str]:
    """Cancel and stop every starting/running attempt; returns counts by outcome.

    ``record_wait_s`` > 0 (the worker runs and records endings): then wait that long at most
    until none of them is active any more; ``recorded`` counts those that ended, ``pending``
    those left to the worker's next start.
    """
    engine = make_engine(settings.database_url)
    counts: Counter[str] = Counter()
    try:
        # Several hosts (docs/several-hosts.md): only this host's attempts.
        own = instance_id(settings.data_dir) if several_hosts(engine) else None
        reader, runs = RunReader(engine, worker_instance_id=own), RunRepository(engine)
        active: list[ActiveAttempt] = []
        after: str | None = None
        while True:
            page = reader.active_attempts(limit=_PAGE, after_id=after)
            active.extend(page)
            if len(page) < _PAGE:
                break
            after = page[-1].attempt_id
        for attempt in active:
            with contextlib.suppress(DomainError):  # ended meanwhile: nothing to cancel
                runs.request_cancel(run_id=attempt.run_id, reason=SERVICE_STOP_REASON)
        grace = settings.profile.stop_grace_s
        root = detect(settings.cgroup_root)
        with ThreadPoolExecutor(max_workers=_PARALLEL) as pool:
            results = pool.map(lambda a: _stop_one(a.handle, grace, root), active)
            counts.update(results)
        if record_wait_s > 0 and active:
            left = _until_recorded(reader, [a.attempt_id for a in active], record_wait_s)
            counts["recorded"] = len(active) - left
            if left:
                counts["pending"] = left
    finally:
        engine.dispose()
    return counts


def _stop_one(handle: ProcessHandle | None, grace_s: float, root: CgroupRoot | None) -> str:
    if handle is None:
        return "no_handle"  # never reached running: the reconciler settles it
    result = stop_handle(handle, grace_seconds=grace_s, cgroup_root=root)
    if shim_alive(handle):  # the boot id too: after a reboot the pid may be anyone's
        wait_exit(handle.shim_pid, _SHIM_WAIT_S)  # let it publish the receipt
    return result


def _until_recorded(reader: RunReader, attempt_ids: list[str], wait_s: float) -> int:
    """How many of ``attempt_ids`` are still active after at most ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        left = sum(
            len(reader.active_among(attempt_ids[i : i + _PAGE]))
            for i in range(0, len(attempt_ids), _PAGE)
        )
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL_S)
