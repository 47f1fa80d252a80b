"""The one composition root (STYLE.md §2): settings in, a private AppContext out.

Every part is overridable by keyword. The api lifespan calls ``build_context`` then
``start_background()``, and ``close()`` on shutdown; tests call it with a temporary data dir.

Hooks for the execution layer (docs/design.md §2.2), one meaning each: ``on_enqueued``
(the dispatcher's drain) runs after each committed enqueue, ``on_cancel_requested`` (the
worker's ``wake``: its cancellation sweep runs now) after each committed cancel intent of a
run still starting or running, and ``periodic`` (the drain again) every
``periodic_interval_s``, the dispatcher's slow loop. All run on one daemon thread started by
``start_background()``: kicks coalesce, a route never waits for them, and an exception in
them is logged (type only) and never reaches a route. On close, ``halt`` is called first (no
new dispatch pass starts), then the thread is joined, so the launches in flight finish before
the worker client closes and before ``qinglong serve`` stops the worker
(docs/rolling-restarts.md).
``ready_checks`` add named readiness checks (the worker socket ping) returning ``None``
when fine or a short reason when not; all of them run concurrently under one deadline
(app/context/readiness.py).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from app.context.execution_wiring import BUDGET_POLL_S, build_execution
from app.context.facade import NO_SCHEDULE_HOOKS, AppFacade, RetentionConfig
from app.context.logs import LogStore
from app.context.metrics import render as render_metrics
from app.context.readiness import (
    DEFAULT_DEADLINE_S,
    ReadinessProbe,
    ReadyCheck,
    database_check,
    disk_check,
)
from app.context.schedule_loop import ScheduleLoop
from app.domain.ids import now_ms
from app.domain.retention import GlobalBudgets
from app.failure_log import FailureLog
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.lease_repo import LeaseRepository, several_hosts
from app.storage.retention_repo import RetentionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.schedules_repo import ScheduleRepository
from app.storage.secret_crypto import KeyRing
from app.storage.secrets_repo import SecretRepository
from app.storage.tokens_repo import TokenRepository
from app.worker.instance import instance_id

if TYPE_CHECKING:  # psycopg is imported only where PostgreSQL is used
    from app.storage.async_reads import AsyncReads

log = logging.getLogger("qinglong.context")

# A hook may return False: it skipped its work (a drain with no worker to talk to read
# nothing), so its run says nothing about a failing pass having recovered.
Hook = Callable[[], bool | None]
# How long close waits for the launches in flight; inside the supervisor's stop bound.
STOP_TIMEOUT_S = 5.0


class Background:
    """One daemon thread: ``on_enqueued`` and ``on_cancel_requested`` when kicked (the facade's
    ``IntentHooks``), ``periodic`` on a timer."""

    def __init__(
        self,
        *,
        on_enqueued: Hook | None,
        on_cancel_requested: Hook | None = None,
        periodic: Hook | None,
        interval_s: float,
        halt: Hook | None = None,
        soon: Callable[[], bool] | None = None,
        soon_interval_s: float = BUDGET_POLL_S,
        next_due_s: Callable[[int], float | None] | None = None,
    ) -> None:
        # ``soon``: while it answers True, ``periodic`` runs every ``soon_interval_s``
        # (the budget poll, docs/concurrency-budgets.md §4).
        self._soon = soon
        self._soon_interval_s = soon_interval_s
        # ``next_due_s(since_ms)``: seconds until the earliest waiting retry whose instant is
        # later than ``since_ms`` (None: none), 0 once passed; ``periodic`` runs then rather
        # than at its next interval (docs/retries.md §2). ``since_ms`` is when the last pass
        # began: a retry due after that instant may have come due while the pass ran, after
        # its promotion read, so it gets a pass of its own at once, not a whole interval later.
        self._next_due_s = next_due_s
        self._pass_began_ms = 0
        self._on_enqueued = on_enqueued
        self._on_cancel_requested = on_cancel_requested
        self._periodic = periodic
        self._interval_s = interval_s
        self._halt = halt
        self._kicked = threading.Event()
        self._enqueued = threading.Event()
        self._cancel_requested = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # One per hook: a wake that works beside a drain that fails must not log both turns.
        self._failures = {
            name: FailureLog(log, f"background pass ({name})")
            for name in ("periodic", "cancel", "enqueued")
        }
        # The read that sets the next wake runs before every pass: the database away, it
        # failed once a tick, each failure a line of its own.
        self._due_failures = FailureLog(log, "next retry read", level=logging.WARNING)

    def enqueued(self) -> None:
        """Ask for an ``on_enqueued`` pass soon; never blocks, never raises."""
        self._enqueued.set()
        self._kicked.set()

    def cancel_requested(self) -> None:
        """Ask for an ``on_cancel_requested`` call soon; never blocks, never raises."""
        self._cancel_requested.set()
        self._kicked.set()

    def start(self) -> None:
        """Start the thread if there is anything to run (idempotent)."""
        hooks = (self._on_enqueued, self._on_cancel_requested, self._periodic)
        if self._thread is not None or all(hook is None for hook in hooks):
            return
        self._thread = threading.Thread(target=self._loop, name="ql-background", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Halt the hooks (no new pass), let the current pass finish, wait for it (bounded)."""
        self._stopping.set()
        if self._halt is not None:
            self._halt()
        self._kicked.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("dispatch still busy after %.0f s; closing anyway", timeout_s)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            kicked = self._kicked.wait(self._timeout())
            if self._stopping.is_set():
                return
            self._kicked.clear()
            if not kicked:
                self._pass_began_ms = now_ms()
                self._run(self._periodic, "periodic")
                continue
            # The wake first: it is one socket call, and a cancel should not wait for a drain.
            if self._cancel_requested.is_set():
                self._cancel_requested.clear()
                self._run(self._on_cancel_requested, "cancel")
            if self._enqueued.is_set():
                self._enqueued.clear()
                self._pass_began_ms = now_ms()
                self._run(self._on_enqueued, "enqueued")

    def _timeout(self) -> float | None:
        if self._periodic is None:
            return None
        timeout = self._interval_s
        if self._soon is not None and self._soon():
            timeout = min(self._soon_interval_s, self._interval_s)
        if self._next_due_s is not None:
            try:
                due = self._next_due_s(self._pass_began_ms)
            except Exception as exc:  # a read that failed: the interval is the fallback
                self._due_failures.failed(exc)
                due = None
            else:
                self._due_failures.succeeded()
            if due is not None:
                timeout = min(timeout, max(due, 0.0))
        return timeout

    def _run(self, hook: Hook | None, name: str) -> None:
        if hook is None:
            return
        try:
            if hook() is not False:  # False: skipped, no verdict (see ``Hook``)
                self._failures[name].succeeded()
        except Exception as exc:  # a failed pass is retried by the next kick or tick
            self._failures[name].failed(exc)  # a line when it starts, then one a minute


@dataclass
class AppContext:
    """What one api process holds privately; routes see only ``facade``."""

    settings: Settings
    engine: Engine
    facade: AppFacade
    background: Background
    owns_engine: bool = True
    closers: list[Hook] = field(default_factory=list)
    # Closed on the event loop by ``aclose`` (the api lifespan), before ``close``.
    async_reads: AsyncReads | None = None
    schedule_loop: ScheduleLoop | None = None

    def start_background(self) -> None:
        """Start the dispatcher hooks and the scheduling loop (the lifespan, once up)."""
        self.background.start()
        if self.schedule_loop is not None:
            self.schedule_loop.start()

    async def aclose(self) -> None:
        """``close``, after closing the event loop's own read connections (if any)."""
        try:
            if self.async_reads is not None:
                await self.async_reads.aclose()
        finally:
            self.close()

    def close(self) -> None:
        """Stop background work, run registered closers, dispose of the engine if ours."""
        if self.schedule_loop is not None:
            self.schedule_loop.stop()  # first: it kicks the drain
        self.background.stop()
        for closer in reversed(self.closers):
            try:
                closer()
            except Exception as exc:
                log.error("closing failed: %s", type(exc).__name__)
        if self.owns_engine:
            self.engine.dispose()


def retry_wake(reader: RunReader) -> Callable[[int], float | None]:
    """Seconds until the earliest waiting retry's ``not_before_ms`` later than ``since_ms``
    (one indexed read; 0 when it passed already), so the dispatch loop wakes for it and for
    nothing else (docs/retries.md §2). Those not later than ``since_ms`` were due when the
    last pass began: that pass promoted them; else a budget holds them (it has its own poll),
    or the pass promoted its limit or met no worker, and the slow tick comes back for them."""

    def due(since_ms: int) -> float | None:
        now = now_ms()
        at = reader.next_retry_at_ms(after_ms=min(since_ms, now))
        return None if at is None else max((at - now) / 1000 + 0.001, 0.0)

    return due


def build_context(
    settings: Settings,
    *,
    engine: Engine | None = None,
    definitions: DefinitionRepository | None = None,
    runs: RunRepository | None = None,
    reader: RunReader | None = None,
    tokens: TokenRepository | None = None,
    secrets: SecretRepository | None = None,
    key_ring: KeyRing | None = None,
    logs: LogStore | None = None,
    on_enqueued: Hook | None = None,
    on_cancel_requested: Hook | None = None,
    periodic: Hook | None = None,
    periodic_interval_s: float = 2.0,
    ready_checks: Mapping[str, ReadyCheck] | None = None,
    ready_deadline_s: float = DEFAULT_DEADLINE_S,
    execution: bool = True,
    schedules: bool = True,
) -> AppContext:
    """Build everything from ``settings``; any part may be passed in instead.

    With ``execution`` (the default) the dispatcher drains after each enqueue and on the slow
    loop, and a cancel intent wakes the worker, through the worker socket; hooks passed in
    explicitly take precedence.
    """
    owns_engine = engine is None
    engine = engine or make_engine(settings.database_url)
    settings.ensure_data_dir()
    if secrets is None:
        ring = key_ring or KeyRing.from_settings(
            secret_key=settings.secret_key, key_file=settings.key_file
        )
        secrets = SecretRepository(engine, ring)
    definitions = definitions or DefinitionRepository(engine)
    runs = runs or RunRepository(engine)
    async_reads = None
    if reader is None:
        if (engine.dialect.name, engine.dialect.driver) == ("postgresql", "psycopg"):
            from app.storage.async_reads import AsyncReads  # psycopg: PostgreSQL only

            async_reads = AsyncReads(engine)
        reader = RunReader(engine, async_reads=async_reads)
    reserve = settings.profile.free_space_reserve_bytes
    # With execution, also what the disk admission needs to start a run (else runs wait).
    logs_dir = settings.logs_dir if execution else None
    to_start = settings.profile.free_bytes_to_start
    checks: dict[str, ReadyCheck] = {
        "database": lambda: database_check(engine),
        "disk": lambda: disk_check(
            settings.data_dir,
            reserve,
            logs_dir=logs_dir,
            bytes_to_start=to_start,
            receipts_dir=settings.receipts_dir if execution else None,
        ),
    }
    closers: list[Hook] = []
    halt: Hook | None = None
    soon: Callable[[], bool] | None = None
    worker_away: Callable[[], bool] | None = None
    disk_low: Callable[[], bool] | None = None
    if execution:
        hooks = build_execution(
            settings,
            candidates=reader,
            definitions=definitions,
            secrets=secrets,
            transitions=runs,
            settings_interval_s=periodic_interval_s,
            promote_due=lambda limit: runs.promote_due_retries(limit=limit),
        )
        checks["worker"] = hooks.worker_ready
        closers.append(hooks.close)
        halt = hooks.halt
        worker_away, disk_low = hooks.worker_away, hooks.disk_low
        on_enqueued = on_enqueued or hooks.drain
        on_cancel_requested = on_cancel_requested or hooks.wake_worker
        if periodic is None:
            periodic, soon = hooks.tick, hooks.budget_wait
    checks.update(ready_checks or {})

    probe = ReadinessProbe(
        checks, deadline_s=ready_deadline_s, facts=hooks.worker_facts if execution else None
    )
    closers.insert(0, probe.close)
    background = Background(
        on_enqueued=on_enqueued,
        on_cancel_requested=on_cancel_requested,
        periodic=periodic,
        interval_s=periodic_interval_s,
        halt=halt,
        soon=soon,
        soon_interval_s=BUDGET_POLL_S,
        next_due_s=retry_wake(reader) if execution else None,
    )
    schedule_repo = ScheduleRepository(engine, max_queued=settings.max_queued)
    several = several_hosts(engine)  # logs of other hosts' attempts (docs/several-hosts.md)
    # One timer per api process (docs/schedules.md §4); runs it creates kick the drain.
    loop = None
    if schedules:
        loop = ScheduleLoop(
            schedule_repo,
            on_fired=background.enqueued,
            on_cancel_requested=background.cancel_requested,
        )
    facade = AppFacade(
        _definitions=definitions,
        _runs=runs,
        _reader=reader,
        _tokens=tokens or TokenRepository(engine),
        _secrets=secrets,
        _logs=logs
        or LogStore(root=settings.logs_dir, quota_bytes=settings.profile.log_quota_bytes),
        _readiness_probe=probe,
        _intents=background,
        reads_inline=engine.dialect.name == "sqlite",
        run_as_allowed=frozenset(settings.job.allowed),
        job_isolation="job_user" if settings.job.user else "same_user",
        max_queued=settings.max_queued,
        max_running=settings.max_running,
        worker_away=worker_away,
        disk_low=disk_low,
        _schedules=schedule_repo,
        _schedule_hooks=loop if loop is not None else NO_SCHEDULE_HOOKS,
        own_instance_id=instance_id(settings.data_dir) if several else None,
        _leases=LeaseRepository(engine) if several else None,
        _metrics=functools.partial(render_metrics, engine),
        _retention=RetentionRepository(engine),
        retention_config=RetentionConfig(
            policy=settings.retention.policy(settings.profile),
            budgets=GlobalBudgets(
                total_log_bytes=settings.retention.total_log_bytes_of(settings.profile),
                free_reserve_bytes=settings.profile.free_space_reserve_bytes,
            ),
            enabled=settings.retention.enabled,
        ),
    )
    return AppContext(
        settings=settings,
        engine=engine,
        facade=facade,
        background=background,
        owns_engine=owns_engine,
        closers=closers,
        async_reads=async_reads,
        schedule_loop=loop,
    )
