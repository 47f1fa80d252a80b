"""Wires the api's private execution kernel: worker client, dispatcher, the drain and wake hooks.

The dispatcher is reachable only through the hooks built here (docs/design.md §2.2): the
facade never sees it, the launcher or the coordinator.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.adapters.worker_client import SOCKET_FOREIGN, WorkerClient
from app.context.metrics import CREATED_TO_STARTED, DISPATCH_PASS
from app.domain.errors import ErrorCode, WorkerUnavailable
from app.domain.model import ProcessHandle, Run
from app.execution.dispatcher import Dispatcher, PassResult, build_dispatcher
from app.execution.materializer import ORPHAN_LOG_AGE_S, LogSpares, prepare_log_shards
from app.execution.ports import (
    CandidateSource,
    DefinitionSource,
    RunTransitions,
    SecretSource,
)
from app.failure_log import FailureLog
from app.settings import Settings
from app.worker.identity import read_identity, runs
from app.worker.instance import instance_id
from app.worker.process_limit import HELD_BY

log = logging.getLogger("qinglong.dispatch")

# One drain runs passes until a pass activates nothing; each pass is bounded by the profile's
# page size and stops after one activation (docs/design.md §3.3), so a drain is bounded too.
MAX_PASSES_PER_DRAIN = 256
# The readiness ping's own budget: one try, well inside the probe's deadline (a stopped
# worker must make /readyz say so, not hang it for the client's 30 s read timeout).
READY_PING_TIMEOUT_S = 0.4
# The drain's ping before a pass: a stalled worker counts as unavailable (dispatch backs off)
# instead of holding the background thread, and so a shutdown's halt, for 30 s.
DRAIN_PING_TIMEOUT_S = 2.0
# While a budget keeps runs queued, the slow loop looks this often whether an active run
# ended (one count query) and drains at once when one did (docs/concurrency-budgets.md §4).
BUDGET_POLL_S = 0.05


def drain_concurrency(page_size: int) -> int:
    """How many passes one drain runs at once: edge (page 4) 1, standalone (page 16) 4.

    A launch spends most of its time waiting for the shim's status line (interpreter
    start-up), so overlapping passes multiply throughput. Overlap is safe by construction:
    every claim is a database compare-and-set (docs/design.md §2.2, §3.3).
    """
    return max(1, min(4, page_size // 4))


@dataclass
class DispatchBackoff:
    """When the next drain may talk to the worker again after finding it unavailable.

    docs/design.md §3.3 (no silent retry storm): the first unavailability waits ``base_s``, each
    further one twice as long, up to ``cap_s``; a drain that reaches the worker and meets no
    unavailability resets it. Meanwhile drains return at once: runs just stay queued. Used
    by the one background thread only.
    """

    base_s: float = 0.25
    cap_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    delay_s: float = field(default=0.0, init=False)
    _not_before: float = field(default=0.0, init=False)

    def due(self) -> bool:
        """True when a drain may ping and launch now."""
        return self.clock() >= self._not_before

    def unavailable(self) -> None:
        """The worker did not answer or refused: wait longer before the next try."""
        if self.delay_s == 0.0:
            log.warning("worker unavailable: dispatch backs off, runs stay queued")
        self.delay_s = min(self.cap_s, max(self.base_s, self.delay_s * 2))
        self._not_before = self.clock() + self.delay_s

    def answered(self) -> None:
        """A drain reached the worker without unavailability: no more waiting."""
        if self.delay_s != 0.0:
            log.info("worker answers again: dispatch resumes")
        self.delay_s = 0.0
        self._not_before = 0.0


@dataclass
class HostWorker:
    """This host's worker as its last ping described it (docs/several-hosts.md §2): the
    instance and lease epoch every start through it records on its attempt."""

    own_instance_id: str
    instance_id: str | None = None
    epoch: int | None = None

    def answered(self, ping: dict[str, Any] | None) -> bool:
        """Take the ping's lease facts; False when the worker is another instance's (the
        socket belongs to another data dir): then this api must not dispatch through it."""
        if not isinstance(ping, dict):
            return True  # a client double without an answer body: nothing to record
        found, epoch = ping.get("instance_id"), ping.get("epoch")
        if not isinstance(found, str) or type(epoch) is not int:
            return True  # a worker older than the facts: nothing to record
        if found != self.own_instance_id:
            log.warning("the worker socket answers for another instance: dispatch waits")
            return False
        self.instance_id, self.epoch = found, epoch
        return True


class HostTransitions:
    """The run transitions, with T1 recording this host's worker (and its per-host budget)."""

    def __init__(self, inner: RunTransitions, host: HostWorker) -> None:
        self._inner = inner
        self._host = host

    def begin_dispatch(
        self,
        *,
        run_id: str,
        attempt_id: str,
        expected_version: int | None,
        token_digest: str,
        deadline_at_ms: int | None,
        log_artifact_id: str,
        max_running: int | None = None,
        max_concurrent: int | None = None,
        worker_instance_id: str | None = None,
        lease_epoch: int | None = None,
    ) -> Run:
        """T1 with the instance and epoch of this host's worker (its last ping)."""
        return self._inner.begin_dispatch(
            run_id=run_id, attempt_id=attempt_id, expected_version=expected_version,
            token_digest=token_digest, deadline_at_ms=deadline_at_ms,
            log_artifact_id=log_artifact_id, max_running=max_running,
            max_concurrent=max_concurrent,
            worker_instance_id=worker_instance_id or self._host.instance_id,
            lease_epoch=lease_epoch if lease_epoch is not None else self._host.epoch,
        )  # fmt: skip

    def record_running(
        self, *, run_id: str, attempt_id: str, handle: ProcessHandle, started_at_ms: int
    ) -> Run:
        """T2, unchanged."""
        return self._inner.record_running(
            run_id=run_id, attempt_id=attempt_id, handle=handle, started_at_ms=started_at_ms
        )

    def fail_attempt(
        self,
        *,
        run_id: str,
        attempt_id: str,
        error_code: ErrorCode,
        lost: bool = False,
        expected_version: int | None = None,
        detail: Mapping[str, str] | None = None,
    ) -> Run:
        """Unchanged."""
        return self._inner.fail_attempt(
            run_id=run_id, attempt_id=attempt_id, error_code=error_code, lost=lost,
            expected_version=expected_version, detail=detail,
        )  # fmt: skip

    def requeue_unspawned(self, *, run_id: str, attempt_id: str) -> Run:
        """Unchanged."""
        return self._inner.requeue_unspawned(run_id=run_id, attempt_id=attempt_id)


@dataclass(frozen=True)
class ExecutionHooks:
    """What the composition root plugs into the background thread and readiness."""

    # False when it did nothing (halted, backing off, no worker): no verdict on the database.
    drain: Callable[[], bool]
    worker_ready: Callable[[], str | None]
    # What the worker's last answered ping said for /readyz (its process limit); {} when none.
    worker_facts: Callable[[], dict[str, Any]]
    # After a cancel intent: the worker's cancellation sweep runs now, not at its next tick.
    wake_worker: Callable[[], None]
    close: Callable[[], None]
    # Shutdown: no pass starts after this; the passes in flight finish (their launches too).
    halt: Callable[[], None]
    # The slow loop's hook: a drain, or while budget_wait() only a count unless a run ended.
    tick: Callable[[], bool] = lambda: True
    # True while the last drain left runs queued because of a budget: tick every BUDGET_POLL_S.
    budget_wait: Callable[[], bool] = lambda: False
    # True while dispatch backs off because this process's last try found no worker answering
    # (runs stay queued until it answers): a queued run's ``waiting`` says so.
    worker_away: Callable[[], bool] = lambda: False
    # True while the last drain left runs queued for want of free space (the disk admission).
    disk_low: Callable[[], bool] = lambda: False


def process_limit_of(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """The process limit a worker's ``ping`` answer names (api-schemas/worker-socket.md), or
    None: a worker of a build before it says none, and a shape this build cannot read is
    shown as none rather than passed on."""
    said = answer.get("process_limit")
    if not isinstance(said, dict):
        return None
    most, how = said.get("max_processes"), said.get("held_by")
    if how not in HELD_BY or not (most is None or (type(most) is int and most > 0)):
        return None
    return {"max_processes": most, "held_by": how}


def build_execution(
    settings: Settings,
    *,
    candidates: CandidateSource,
    definitions: DefinitionSource,
    secrets: SecretSource,
    transitions: RunTransitions,
    client: WorkerClient | None = None,
    backoff: DispatchBackoff | None = None,
    settings_interval_s: float = 2.0,
    promote_due: Callable[[int], int] | None = None,
) -> ExecutionHooks:
    """Build the worker client and the dispatcher; return the hooks that drive them.

    ``settings_interval_s`` is the slow loop's interval (the fallback while budget-blocked).
    ``promote_due(limit)``: before a drain's passes, make retries whose instant passed
    dispatch candidates again (``RunRepository.promote_due_retries``, docs/retries.md §2).
    """
    worker = client or WorkerClient(settings.socket_path, connect_timeout_s=1.0)
    pause = backoff or DispatchBackoff()
    drainers = drain_concurrency(settings.profile.dispatch_page_size)
    # The api's data dir is its host's worker's: the same instance id (docs/several-hosts.md).
    settings.ensure_data_dir()
    host = HostWorker(own_instance_id=instance_id(settings.data_dir))
    budget_per_host = getattr(candidates, "budget_per_host", None)
    if budget_per_host is not None:
        budget_per_host(host.own_instance_id)
    spares = _log_spares(settings)
    dispatcher = build_dispatcher(
        candidates=candidates,
        definitions=definitions,
        secrets=secrets,
        transitions=HostTransitions(transitions, host),
        launcher=worker,
        controller=worker,
        settings_like=settings,
        max_running=settings.max_running,
        spares=spares,
    )

    halted = threading.Event()
    # The active-run count when the last drain ended blocked by a budget (None: not blocked),
    # and when that drain ran; read and written by the one background thread only.
    wait: dict[str, float | None] = {"active": None, "at": 0.0}
    # Whether the last drain that reached the worker left runs queued for want of free space
    # (the disk admission): a queued run's ``waiting`` says so.
    disk = {"low": False}
    shards_made = threading.Event()
    swept = {"next": 0.0}  # when the next sweep of dead processes' log spares is due
    # Before every drain's passes while the worker answers: the database away, a line a tick.
    promote_failures = FailureLog(log, "promoting due retries", level=logging.WARNING)

    def drain() -> bool:
        try:
            return _drain_once()
        finally:
            if not halted.is_set():
                _ahead()

    def _ahead() -> None:
        """After a drain's launches: what the next launch would otherwise make on its way.
        Only a head start: each launch checks (or makes) its own."""
        if not shards_made.is_set():
            # Once, on a thread of its own: on a fresh data dir the 256 mkdirs take a good
            # part of a second, which no drain should wait for (docs/design.md §3.4).
            shards_made.set()
            threading.Thread(target=_make_shards, name="ql-log-shards", daemon=True).start()
        if spares is None:
            return
        try:
            spares.make()  # at once when one is held
            if time.monotonic() >= swept["next"]:
                # The spares of api processes that are gone, within about the orphan rule's
                # age: until then a log such a process linked keeps two names.
                swept["next"] = time.monotonic() + ORPHAN_LOG_AGE_S
                spares.sweep(runs)
        except OSError as exc:
            log.warning("making the log files ahead failed: %s", type(exc).__name__)

    def _make_shards() -> None:
        try:
            prepare_log_shards(settings.logs_dir)
        except OSError as exc:
            log.warning("making the log shards failed: %s", type(exc).__name__)

    def _drain_once() -> bool:
        # No worker, no dispatch: runs stay queued (never failed) until it answers again,
        # asked at a growing interval, never in a loop. Such a drain read nothing: False.
        if halted.is_set() or not pause.due():
            return False
        try:
            answer = worker.ping(timeout_s=DRAIN_PING_TIMEOUT_S)
        except WorkerUnavailable:
            pause.unavailable()
            return False
        if not host.answered(answer):
            pause.unavailable()
            return False
        if promote_due is not None:
            try:
                promote_due(MAX_PASSES_PER_DRAIN)  # at most as many as a drain can start
            except Exception as exc:  # the queue's other runs still dispatch; next drain again
                promote_failures.failed(exc)
            else:
                promote_failures.succeeded()
        blocked, low = threading.Event(), threading.Event()
        if _drain_concurrently(dispatcher, drainers, halted=halted, blocked=blocked, low=low):
            pause.unavailable()
        else:
            pause.answered()
        wait["at"] = time.monotonic()
        wait["active"] = candidates.active_count() if blocked.is_set() else None
        disk["low"] = low.is_set()
        return True

    def tick() -> bool:
        active = wait["active"]
        at = wait["at"] or 0.0
        # Blocked by a budget: drain only once a run ended (the count fell), or at the slow
        # loop's own pace as the fallback (a run ended here while another started elsewhere).
        if (
            active is not None
            and time.monotonic() - at < settings_interval_s
            and candidates.active_count() >= active
        ):
            return True  # the count was read
        return drain()

    told: dict[str, Any] = {}  # the worker's facts, from its last ping that answered

    def worker_ready() -> str | None:
        try:
            answer = worker.ping(timeout_s=READY_PING_TIMEOUT_S)
        except WorkerUnavailable as exc:
            told.clear()
            if exc.reason == SOCKET_FOREIGN:
                return "worker socket served by another user"
            return "worker socket not answering"
        told["process_limit"] = process_limit_of(answer)
        return None

    def wake_worker() -> None:
        # Only a nudge (False when unreachable): the intent is committed, and the worker's own
        # sweep acts on it at its next tick anyway.
        worker.wake()

    return ExecutionHooks(
        drain=drain,
        worker_ready=worker_ready,
        worker_facts=lambda: dict(told),
        worker_away=lambda: pause.delay_s != 0.0,
        disk_low=lambda: disk["low"],
        wake_worker=wake_worker,
        close=worker.close,
        halt=halted.set,
        tick=tick,
        budget_wait=lambda: wait["active"] is not None,
    )


def _log_spares(settings: Settings) -> LogSpares | None:
    """This api process's log spare (None when its own identity cannot be read)."""
    own = read_identity(os.getpid())
    if own is None:
        return None
    return LogSpares(settings.logs_dir, (own.pid, own.start_ticks))



def _drain_concurrently(
    dispatcher: Dispatcher,
    drainers: int,
    halted: threading.Event | None = None,
    blocked: threading.Event | None = None,
    low: threading.Event | None = None,
) -> bool:
    """Drain; only when the first pass activated a run and its page held more candidates,
    add ``drainers - 1`` helper threads.

    The slow loop ticks every few seconds with usually nothing queued: one pass in this
    thread answers that without starting any thread. True when a pass found the worker
    unavailable: then every thread stops after its current pass (docs/design.md §3.3). After
    ``halted`` (shutdown) no thread starts another pass. ``blocked`` is set when a pass left
    a run queued because of a budget, ``low`` when one did for want of free space.
    """
    unavailable = threading.Event()
    halted = halted or threading.Event()
    blocked = blocked or threading.Event()
    low = low or threading.Event()
    if drainers <= 1:
        _drain(dispatcher, unavailable, halted, blocked, low)
        return unavailable.is_set()
    if not _log_pass(_timed_pass(dispatcher), unavailable, blocked, low):
        return unavailable.is_set()
    failures = FailureLog(log, "background pass (drain helper)")
    helpers = [
        threading.Thread(
            target=_drain_logged,
            args=(dispatcher, unavailable, halted, blocked, low, failures),
            name="ql-drain",
            daemon=True,
        )
        for _ in range(drainers - 1)
    ]
    for thread in helpers:
        thread.start()
    try:
        _drain(dispatcher, unavailable, halted, blocked, low)
    finally:
        for thread in helpers:
            thread.join()
    return unavailable.is_set()


def _drain_logged(
    dispatcher: Dispatcher,
    unavailable: threading.Event,
    halted: threading.Event,
    blocked: threading.Event,
    low: threading.Event,
    failures: FailureLog,
) -> None:
    try:
        _drain(dispatcher, unavailable, halted, blocked, low)
    except Exception as exc:  # a failed pass is retried by the next kick or tick
        failures.failed(exc)  # helpers failing the same way: one line


def _drain(
    dispatcher: Dispatcher,
    unavailable: threading.Event,
    halted: threading.Event,
    blocked: threading.Event,
    low: threading.Event,
) -> None:
    for _ in range(MAX_PASSES_PER_DRAIN):
        if halted.is_set() or unavailable.is_set():
            return
        if not _log_pass(_timed_pass(dispatcher), unavailable, blocked, low):
            return


def _timed_pass(dispatcher: Dispatcher) -> PassResult:
    """One pass, observed for ``GET /metrics`` (docs/metrics.md)."""
    began = time.perf_counter()
    result = dispatcher.run_pass()
    DISPATCH_PASS.observe(time.perf_counter() - began)
    for outcome in result.outcomes:
        if outcome.created_to_started_ms is not None:
            CREATED_TO_STARTED.observe(outcome.created_to_started_ms / 1000)
    return result


DISK_LOW_LOG_EVERY_S = 60.0
_disk_low_said = {"next": 0.0}


def _log_pass(
    result: PassResult,
    unavailable: threading.Event,
    blocked: threading.Event | None = None,
    low: threading.Event | None = None,
) -> bool:
    """Log a launch that did not end running; True when another pass may find work."""
    failure = result.launch_failure
    if failure is not None:
        # Ids and stable codes only: never argv, environment or output.
        log.warning(
            "run %s attempt %s did not start: %s %s",
            failure.run_id,
            failure.attempt_id,
            failure.kind,
            " ".join(filter(None, (failure.error_code, failure.reason))),
        )
    if result.worker_unavailable:
        unavailable.set()  # stop at the first unavailability; the drain backs off
        return False
    if result.disk_low:
        if low is not None:
            low.set()
        now = time.monotonic()
        if now >= _disk_low_said["next"]:  # a minute apart: /readyz says it all along
            _disk_low_said["next"] = now + DISK_LOW_LOG_EVERY_S
            log.warning(
                "queued runs wait: too little free space for job logs (the reserve plus a "
                "log's quota) or receipts, or a read-only file system; /readyz says which "
                "(they start once space returns)"
            )
        return False  # the next tick tries again; another pass now would meet the same
    if result.budget_blocked and blocked is not None:
        blocked.set()
    if result.at_capacity:
        return False  # nothing may start until a run ends: the budget poll watches for it
    # After a launch, another pass only where the page showed more: a queue of one run (a
    # run posted to an idle service, the paced load) ends its drain with this pass, instead
    # of helpers and a last pass each paying a count and a page read to find nothing.
    return result.truncated or (result.activated is not None and result.more_in_page)
