"""``qinglong serve --stop-jobs-on-exit``: stop the running jobs after the services stopped.

By default a shutdown leaves jobs running (their shims are detached) and the worker
reconciles them at its next start. With the flag, once the api and the worker are down, each
active attempt gets a cancel intent (reason ``user``; like every reason but ``timeout`` its
ending maps to ``cancelled``, never retried, when the worker consumes the shim's receipt at
the next start) and its job is stopped by exact identity
(docs/design.md §3.10: TERM, grace, identity re-check, KILL; a mismatched identity is never
signalled). The shim then publishes its receipt and exits; we wait for it, bounded.
"""

from __future__ import annotations

import contextlib
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
# "user", though no user asked: builds before this one answer 500 for a reason they do not
# know, so ``service_stop`` (read since this build) is written only once a rollback to them
# is no longer supported (docs/operations.md §4).
SERVICE_STOP_REASON: Final = "user"


def stop_active_jobs(settings: Settings) -> Counter[str]:
    """Cancel and stop every starting/running attempt; returns counts by outcome."""
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
