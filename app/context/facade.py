"""The frozen facade the routes call: definition writes/reads, secrets, intents and reads.

It enforces the domain's validation rules (so every caller gets them, not only HTTP), maps a
few storage refusals to what docs/api.md promises, and never returns pids, handles, digests of
tokens, argv of runs or environments (the domain values it returns carry none of those).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from app.adapters.log_proxy import FORWARDED_HEADER, RemoteLog, open_remote_log
from app.context.logs import LogFile, LogStore
from app.context.token_cache import TokenCache
from app.domain.canonical import content_digest
from app.domain.errors import (
    Conflict,
    ErrorCode,
    Gone,
    LogHostUnavailable,
    NotFound,
    ValidationFailed,
)
from app.domain.ids import is_uuid7, now_ms
from app.domain.model import (
    ArchivedFilter,
    Attempt,
    Page,
    Recipe,
    Run,
    RunEvent,
    Schedule,
    ScheduleDecision,
    ScheduleDefinition,
    SecretName,
    TaskRevision,
    TaskSummary,
    Waiting,
)
from app.domain.retention import GlobalBudgets, RetentionPolicy, TaskOverride
from app.domain.retry import validate_retry
from app.domain.states import RunStatus, is_terminal_run
from app.domain.tokens import grants, looks_like_token
from app.domain.validation import (
    parse_instant,
    validate_argv,
    validate_cwd,
    validate_env_value,
    validate_executor,
    validate_leftovers,
    validate_max_concurrent,
    validate_name,
    validate_priority,
    validate_recipe,
    validate_run_as,
    validate_timeout,
)
from app.schedule.slots import local_iso, slots_after, stored_cron, validate
from app.storage.definitions_repo import DefinitionRepository
from app.storage.lease_repo import LeaseRepository
from app.storage.retention_repo import RetentionRepository, StorageFigures
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.schedules_repo import ScheduleRepository, spec_of
from app.storage.secrets_repo import SecretRepository
from app.storage.tokens_repo import TokenRepository
from app.worker.identity import current_boot_id

NEXT_FIRES = 5
RECIPE_ID = re.compile(r"localctx:sha256:[0-9a-f]{64}")
MAX_REVISION = 2**31 - 1
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
_RUN_STATUSES = frozenset(RunStatus)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who called: a live token's id, name and scopes (never its value or digest)."""

    token_id: str
    name: str
    scopes: frozenset[str]
    expires_at_ms: int | None = None  # None: valid until revoked

    def can(self, scope: str) -> bool:
        """True when this principal holds ``scope`` (``admin`` implies every scope)."""
        return grants(self.scopes, scope)


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether this process can serve: every check's outcome (``ok`` or a short reason), and
    facts an operator reads that never make it unready (the worker's process limit)."""

    ready: bool
    checks: dict[str, str]
    facts: dict[str, Any] = field(default_factory=dict)


class IntentHooks(Protocol):
    """Told after an intent commits (app/context/bootstrap.py ``Background``); never blocks."""

    def enqueued(self) -> None:
        """A run was queued: the dispatcher should drain (launch what may start now)."""
        ...

    def cancel_requested(self) -> None:
        """A cancel intent was recorded for a run still starting or running: wake the worker's
        cancellation sweep so it stops the job now, not at its next tick."""
        ...


class ScheduleHooks(Protocol):
    """Told after a schedule change commits (app/context/schedule_loop.py); never blocks."""

    def schedule_changed(self) -> None:
        """A schedule was created, changed or resumed: the loop re-reads the earliest due
        slot now instead of sleeping through it."""
        ...


@dataclass(frozen=True, slots=True)
class NextFire:
    """One coming slot: its instant and its local time in the schedule's zone."""

    at_ms: int
    local: str


class _NoScheduleHooks:
    def schedule_changed(self) -> None:
        """No loop in this process (a test context): nothing to wake."""


NO_SCHEDULE_HOOKS: ScheduleHooks = _NoScheduleHooks()


# A log read another api forwarded (docs/several-hosts.md §5): never forwarded again.
LOG_FORWARDED_HEADER = FORWARDED_HEADER


@dataclass(frozen=True, slots=True)
class TaskRetention:
    """A task's own retention fields (None: the global value) and what is in force."""

    task: str
    override: TaskOverride
    effective: RetentionPolicy
    # False under QL_RETENTION=off: no sweep runs, so ``effective`` is applied to nothing.
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class StorageReport:
    """GET /api/v1/system/storage: the database's figures and the logs' file system."""

    figures: StorageFigures
    free_bytes: int | None
    reserve_bytes: int
    total_log_bytes_budget: int | None
    retention_enabled: bool


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """What the api knows of retention: the global policy and budgets (docs/retention.md)."""

    policy: RetentionPolicy
    budgets: GlobalBudgets
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class AppFacade:
    """The only thing routes may call. Built by ``app.context.bootstrap.build_context``."""

    _definitions: DefinitionRepository
    _runs: RunRepository
    _reader: RunReader
    _tokens: TokenRepository
    _secrets: SecretRepository
    _logs: LogStore
    _readiness_probe: Callable[[], Readiness]
    _intents: IntentHooks
    _token_cache: TokenCache[Principal] = field(default_factory=TokenCache)
    _schedules: ScheduleRepository | None = None
    _schedule_hooks: ScheduleHooks = field(default_factory=lambda: NO_SCHEDULE_HOOKS)
    # True on SQLite: a run read is local work that never waits for a writer (WAL), cheaper
    # than a worker-thread round trip, so async routes may call it on the event loop
    # (figures: bench/README.md).
    # PostgreSQL reads are network round trips and go to a worker thread, except GET one
    # run's, which runs on the event loop's own connections (``get_run_async``).
    reads_inline: bool = False
    # QL_JOB_USERS: what a revision's run_as may name; and who jobs run as by default
    # ("job_user" or "same_user", shown by /readyz; docs/job-user.md).
    run_as_allowed: frozenset[str] = frozenset()
    job_isolation: str = "same_user"
    # QL_MAX_QUEUED: enqueue beyond it is refused 429 QUEUE_FULL (docs/concurrency-budgets.md)
    max_queued: int | None = None
    # QL_MAX_RUNNING: what a queued run may be waiting for (``run_waiting``).
    max_running: int | None = None
    # True while this process's dispatch backs off for want of a worker (``run_waiting``);
    # None without execution (nothing here starts runs).
    worker_away: Callable[[], bool] | None = None
    # True while this process's last drain left runs queued for want of free space.
    disk_low: Callable[[], bool] | None = None
    # GET /metrics: the exposition text (app/context/metrics.py, docs/metrics.md).
    _metrics: Callable[[], bytes] | None = None
    # Retention (docs/retention.md): policies, pins, the storage figures.
    _retention: RetentionRepository | None = None
    retention_config: RetentionConfig | None = None
    # Several hosts (PostgreSQL, docs/several-hosts.md §5): this host's instance id and the
    # leases naming every host's api; None on SQLite (one host holds every log).
    own_instance_id: str | None = None
    _leases: LeaseRepository | None = None

    # -- definitions ------------------------------------------------------------------------

    def put_recipe(self, *, env: dict[str, str], secrets: dict[str, str]) -> tuple[Recipe, bool]:
        """Store a recipe by content address; ``(recipe, created)``."""
        env, secrets = validate_recipe(env, secrets)
        return self._definitions.put_recipe(env=env, secrets=secrets)

    def get_recipe(self, *, recipe_id: str) -> Recipe:
        """One recipe by id."""
        if not RECIPE_ID.fullmatch(recipe_id):
            raise NotFound(ErrorCode.RECIPE_NOT_FOUND, "no such recipe")
        return self._definitions.get_recipe(recipe_id)

    def put_revision(
        self,
        *,
        task: str,
        revision: int,
        executor: str,
        argv: list[str],
        cwd: str | None,
        recipe: str | None,
        timeout_seconds: int | None,
        priority: int,
        leftovers: str = "kill",
        run_as: str | None = None,
        max_concurrent: int | None = None,
        retry: dict[str, object] | None = None,
    ) -> tuple[TaskRevision, bool]:
        """Append a task revision; ``(revision, created)``; Conflict when it differs."""
        validate_name(task, what="task name")
        _check_revision(revision)
        if recipe is not None and not RECIPE_ID.fullmatch(recipe):
            raise ValidationFailed(ErrorCode.RECIPE_NOT_FOUND, "the recipe does not exist")
        try:
            return self._definitions.put_revision(
                task=task,
                revision=revision,
                executor=validate_executor(executor),
                argv=validate_argv(argv),
                cwd=validate_cwd(cwd),
                recipe=recipe,
                timeout_seconds=validate_timeout(timeout_seconds),
                priority=validate_priority(priority),
                leftovers=validate_leftovers(leftovers),
                run_as=validate_run_as(run_as, self.run_as_allowed),
                max_concurrent=validate_max_concurrent(max_concurrent),
                retry=validate_retry(retry),
            )
        except NotFound as exc:
            # A dangling reference in the body is bad input (422), not a missing resource.
            raise ValidationFailed(exc.code, exc.detail) from None

    def get_revision(self, *, task: str, revision: int) -> TaskRevision:
        """One revision of a task."""
        validate_name(task, what="task name")
        _check_revision(revision)
        return self._definitions.get_revision(task, revision)

    def get_task(self, *, task: str) -> tuple[TaskRevision, int | None]:
        """The latest revision of a task, and when it was archived (None: it is not)."""
        validate_name(task, what="task name")
        return self._definitions.get_task(task)

    def list_tasks(
        self, *, limit: int, cursor: str | None, archived: ArchivedFilter = "exclude"
    ) -> Page[TaskSummary]:
        """Tasks with their latest revision, by name; archived ones only when asked."""
        return self._definitions.list_tasks(limit=limit, cursor=cursor, archived=archived)

    def archive_task(self, *, task: str, archived: bool) -> tuple[TaskRevision, int | None]:
        """Archive (or unarchive) a task: hidden from lists, no new run, revision or active
        schedule; its revisions, runs and logs stay (docs/api.md §4)."""
        validate_name(task, what="task name")
        return self._definitions.set_archived(task, archived)

    def list_revisions(self, *, task: str, limit: int, cursor: str | None) -> Page[TaskRevision]:
        """Revisions of a task, newest first."""
        validate_name(task, what="task name")
        return self._definitions.list_revisions(task, limit=limit, cursor=cursor)

    # -- secrets ----------------------------------------------------------------------------

    def put_secret(self, *, name: str, value: str) -> bool:
        """Encrypt and store a value (it becomes an environment value, so the same limits)."""
        validate_name(name, what="secret name")
        validate_env_value(value)
        return self._secrets.put(name=name, value=value)

    def list_secrets(self, *, limit: int, cursor: str | None) -> Page[SecretName]:
        """Secret names with ``updated_at_ms`` (the repository never reads a value here)."""
        return self._secrets.list_names(limit=limit, cursor=cursor)

    def delete_secret(self, *, name: str) -> None:
        """Remove a secret."""
        validate_name(name, what="secret name")
        self._secrets.delete(name)

    # -- auth -------------------------------------------------------------------------------

    def cached_principal(self, token: str) -> Principal | None:
        """The principal of a token authenticated less than a second ago; no I/O."""
        return self._token_cache.get(token)

    def authenticate(self, token: str) -> Principal | None:
        """The principal of a live token, or None (malformed tokens never reach the database)."""
        if not looks_like_token(token):
            return None
        record = self._tokens.authenticate(token)
        if record is None:
            return None
        principal = Principal(
            token_id=record.id,
            name=record.name,
            scopes=record.scopes,
            expires_at_ms=record.expires_at_ms,
        )
        self._token_cache.put(token, principal)
        return principal

    # -- runs -------------------------------------------------------------------------------

    def enqueue_run(
        self,
        *,
        task: str,
        revision: int | None,
        priority: int | None,
        token_id: str,
        idempotency_key: str | None,
        request_digest: str,
    ) -> tuple[Run, bool]:
        """Create a queued run (or return the one this idempotency key made); kick dispatch."""
        validate_name(task, what="task name")
        if revision is not None:
            _check_revision(revision)
        if priority is not None:
            validate_priority(priority)
        _check_idempotency_key(idempotency_key)
        return self._queued(
            lambda: self._runs.enqueue_run(
                task=task,
                revision=revision,
                priority=priority,
                token_id=token_id,
                idempotency_key=idempotency_key,
                request_digest=request_digest,
                max_queued=self.max_queued,
            )
        )

    def rerun(self, *, run_id: str, token_id: str, idempotency_key: str | None) -> tuple[Run, bool]:
        """A new run of the same revision as ``run_id`` (``rerun_of`` it); kick dispatch."""
        _check_run_id(run_id)
        _check_idempotency_key(idempotency_key)
        return self._queued(
            lambda: self._runs.rerun(
                run_id=run_id,
                token_id=token_id,
                idempotency_key=idempotency_key,
                request_digest=content_digest({"rerun_of": run_id}),
                max_queued=self.max_queued,
            )
        )

    def _queued(self, enqueue: Callable[[], tuple[Run, bool]]) -> tuple[Run, bool]:
        """Run an enqueue; a reused Idempotency-Key is a client error (422, docs/api.md §6);
        a new run kicks dispatch."""
        try:
            run, created = enqueue()
        except Conflict as exc:
            if exc.code is ErrorCode.IDEMPOTENCY_KEY_REUSED:
                raise ValidationFailed(exc.code, exc.detail) from None
            raise
        if created:
            self._intents.enqueued()
        return self._with_logs(run), created

    def request_cancel(self, *, run_id: str) -> Run:
        """Record the user's cancel intent once; a queued run is cancelled at once."""
        _check_run_id(run_id)
        run = self._runs.request_cancel(run_id=run_id, reason="user")
        # A queued run ended in that commit; a started one is stopped by the worker's sweep.
        if not is_terminal_run(run.status):
            self._intents.cancel_requested()
        elif run.trigger_kind == "schedule":
            # A run of its schedule may have waited behind this one (docs/schedules.md §5).
            self._intents.enqueued()
        return self._with_logs(run)

    def get_run(self, *, run_id: str) -> Run:
        """One run with its latest attempt."""
        _check_run_id(run_id)
        return self._with_logs(self._reader.get_run(run_id))

    async def get_run_async(self, *, run_id: str) -> Run:
        """``get_run`` without a worker thread: inline on SQLite (see ``reads_inline``), on
        the event loop's own connections on PostgreSQL (app/storage/async_reads.py)."""
        _check_run_id(run_id)
        if self.reads_inline:
            return self._with_logs(self._reader.get_run(run_id))
        return self._with_logs(await self._reader.get_run_async(run_id))

    def run_waiting(self, *, run: Run) -> Waiting | None:
        """Why ``run``, queued, has not started (docs/concurrency-budgets.md §2): its task's
        limit reached or held behind an older run of its schedule (facts of every host), else
        every active slot of this host taken (QL_MAX_RUNNING counts the answering host's
        runs with several hosts), this host's worker not answering the last try to start one,
        or its last try finding too little free space (the disk admission); None when it is
        not queued (read again last, so a run dispatched meanwhile is not told to wait for
        itself), a retry's wait says it (``next_attempt_at_ms``) or nothing holds it back (it
        starts at the next pass)."""
        if run.status != RunStatus.QUEUED.value or run.retry_waits(now_ms()):
            return None
        task_full = slots_full = None
        limit = self._definitions.get_revision(run.task, run.revision).max_concurrent
        if limit is not None and (active := self._reader.active_count(run.task)) >= limit:
            task_full = Waiting("max_concurrent", limit, active)
        if self.max_running is not None:
            active = self._reader.active_count()
            if active >= self.max_running:
                slots_full = Waiting("max_running", self.max_running, active)
        queued, held = self._reader.queued_held(run.id)
        if not queued:
            return None
        if task_full or held or slots_full:
            return task_full or (Waiting("held") if held else None) or slots_full
        if self.worker_away is not None and self.worker_away():
            return Waiting("worker")
        return Waiting("disk") if self.disk_low is not None and self.disk_low() else None

    def list_runs(
        self,
        *,
        task: str | None,
        status: str | None,
        limit: int,
        cursor: str | None,
        schedule: str | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> Page[Run]:
        """Runs newest first, filtered by task, status, the schedule that started them and
        a window of their created time, ``since`` (inclusive) to ``until`` (exclusive), RFC
        3339 instants (docs/api.md §6)."""
        if task is not None:
            validate_name(task, what="task name")
        if status is not None and status not in _RUN_STATUSES:
            raise ValidationFailed(ErrorCode.VALIDATION_FAILED, "unknown run status")
        if schedule is not None:
            validate_name(schedule, what="schedule name")
        since_ms = None if since is None else parse_instant(since, field="since")
        until_ms = None if until is None else parse_instant(until, field="until")
        if since_ms is not None and until_ms is not None and since_ms >= until_ms:
            raise ValidationFailed(
                ErrorCode.VALIDATION_FAILED,
                "since must be before until (the window holds since, not until)",
            )
        page = self._reader.list_runs(
            task=task, status=status, schedule=schedule, since_ms=since_ms, until_ms=until_ms,
            limit=limit, cursor=cursor,
        )  # fmt: skip
        return Page(items=[self._with_logs(r) for r in page.items], next_cursor=page.next_cursor)

    def list_attempts(self, *, run_id: str) -> list[Attempt]:
        """Every attempt of a run, by number."""
        _check_run_id(run_id)
        return [self._logs.with_log_info(a) for a in self._reader.list_attempts(run_id)]

    def list_events(self, *, run_id: str, limit: int, cursor: str | None) -> Page[RunEvent]:
        """A run's events in ``seq`` order."""
        _check_run_id(run_id)
        return self._reader.list_events(run_id, cursor=cursor, limit=limit)

    def open_log(self, *, run_id: str, number: int) -> LogFile:
        """Open an attempt's log read-only (O_NOFOLLOW); the caller closes it."""
        _check_run_id(run_id)
        if not 1 <= number <= MAX_REVISION:
            raise NotFound(ErrorCode.ATTEMPT_NOT_FOUND, "no such attempt")
        attempt = self._reader.get_attempt(run_id, number)
        _refuse_expired(attempt)
        log = self._logs.open(attempt)
        if log.missing and attempt.finished_at_ms is not None:
            # The sweep may have removed it after the read: say so, not "empty".
            again = self._reader.get_attempt(run_id, number)
            if again.log is not None and again.log.expired:
                log.close()
                _refuse_expired(again)
            ours = self.own_instance_id is None or again.worker_instance_id == self.own_instance_id
            if ours and again.log is not None and again.log.bytes > 0:
                # It ended with output on record here, and nothing of the service removes a
                # log but retention: it is not on this disk. An empty 200 would hide that.
                # (With several hosts an attempt of no recorded host, older than migration
                # 0008, may be another host's: it keeps reading as empty.)
                log.close()
                raise Gone(
                    ErrorCode.LOG_MISSING,
                    f"the log file is not on this host's disk ({again.log.bytes} bytes were "
                    "recorded): removed by hand, or a backup restored without it",
                )
            if ours and again.log is None and again.started_at_ms is not None:
                # Its job started, so its shim had opened the log; no size was recorded at its
                # ending because the file was already gone (or recovery ended it): what it
                # printed is lost, not nothing.
                log.close()
                raise Gone(
                    ErrorCode.LOG_MISSING,
                    "the log file is not on this host's disk, and its size was never "
                    "recorded: removed by hand while the job ran or before its ending was "
                    "recorded, or a backup restored without it",
                )
        return log

    # -- retention (docs/retention.md) -------------------------------------------------------

    def get_task_retention(self, *, task: str) -> TaskRetention:
        """The task's retention fields and the policy in force (404 for an unknown task)."""
        validate_name(task, what="task name")
        self._definitions.latest_revision(task)  # TASK_NOT_FOUND
        repo, config = self._retention_parts()
        override = repo.get_override(task) or TaskOverride()
        return TaskRetention(task, override, override.in_force(config.policy), config.enabled)

    def put_task_retention(
        self, *, task: str, override: TaskOverride
    ) -> tuple[TaskRetention, bool]:
        """Replace the task's retention fields; ``(retention, created)``."""
        validate_name(task, what="task name")
        repo, config = self._retention_parts()
        effective = override.over(config.policy)  # VALIDATION_FAILED before any write
        created = repo.put_override(task, override)
        return TaskRetention(task, override, effective, config.enabled), created

    def pin_run(self, *, run_id: str, pinned: bool) -> Run:
        """Pin (or unpin) a run: a pinned run keeps its logs and rows against every policy."""
        _check_run_id(run_id)
        repo, _ = self._retention_parts()
        repo.set_pinned(run_id, pinned)
        return self._with_logs(self._reader.get_run(run_id))

    def storage(self) -> StorageReport:
        """Log bytes, runs kept, free space, the reserve, the last sweep."""
        repo, config = self._retention_parts()
        try:
            st = os.statvfs(self._logs.root if self._logs.root.exists() else self._logs.root.parent)
            free: int | None = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        return StorageReport(
            figures=repo.figures(),
            free_bytes=free,
            reserve_bytes=config.budgets.free_reserve_bytes,
            total_log_bytes_budget=config.budgets.total_log_bytes,
            retention_enabled=config.enabled,
        )

    def _retention_parts(self) -> tuple[RetentionRepository, RetentionConfig]:
        if self._retention is None or self.retention_config is None:
            raise RuntimeError("this context was built without retention")
        return self._retention, self.retention_config

    def metrics(self) -> bytes:
        """Prometheus exposition text: this service's observations and the database's counts."""
        if self._metrics is None:
            raise RuntimeError("metrics are not wired in this context")
        return self._metrics()

    def log_host(self, *, run_id: str, number: int) -> tuple[str, str] | None:
        """Where the attempt's log lives when another host ran it: (its api's base URL, its
        host name); None when it is this host's (or the database has one host).

        Raises: NotFound (no such run or attempt), LogHostUnavailable (that host advertised
        no api address).
        """
        if self.own_instance_id is None or self._leases is None:
            return None
        _check_run_id(run_id)
        if not 1 <= number <= MAX_REVISION:
            raise NotFound(ErrorCode.ATTEMPT_NOT_FOUND, "no such attempt")
        ran_on = self._reader.get_attempt(run_id, number).worker_instance_id
        if ran_on is None or ran_on == self.own_instance_id:
            return None
        lease = self._leases.current(ran_on)
        if lease is None or not lease.base_url:
            raise LogHostUnavailable(None if lease is None else lease.host)
        if _loopback(lease.base_url) and (
            lease.boot_id != current_boot_id() or lease.host != socket.gethostname()
        ):
            # A host on another machine, or in another container of this one (its own network
            # and host name, the same boot id), that advertised a loopback address (its
            # default when it binds 127.0.0.1 behind a proxy): forwarded, the client's token
            # would go to whatever listens on that port here, a job perhaps. Refused instead.
            raise LogHostUnavailable(lease.host)
        return lease.base_url, lease.host

    async def open_remote_log(
        self, *, base_url: str, host: str, path: str, query: str, headers: Mapping[str, str]
    ) -> RemoteLog:
        """Forward a log read to the host that holds the log (docs/several-hosts.md §5).

        Raises: LogHostUnavailable (that host does not answer).
        """
        return await open_remote_log(
            base_url=base_url, path=path, query=query, headers=headers, host=host
        )

    def readiness(self) -> Readiness:
        """Database reachable and migrated, plus any pluggable checks."""
        return self._readiness_probe()

    # -- schedules (docs/schedules.md) ------------------------------------------------------

    def put_schedule(
        self,
        *,
        name: str,
        definition: ScheduleDefinition,
        paused: bool,
        if_match: str | None,
        if_none_match: str | None = None,
    ) -> tuple[Schedule, bool]:
        """Create or replace a schedule; ``(schedule, created)``; wake the loop."""
        validate_name(name, what="schedule name")
        validate_name(definition.task, what="task name")
        if definition.revision is not None:
            _check_revision(definition.revision)
        validate(spec_of(definition))
        if definition.cron is not None:
            definition = dataclasses.replace(definition, cron=stored_cron(definition.cron))
        schedule, created = self._schedule_repo().put_schedule(
            name=name, definition=definition, paused=paused, if_match=if_match,
            if_none_match=if_none_match,
        )  # fmt: skip
        self._schedule_hooks.schedule_changed()
        return schedule, created

    def get_schedule(self, *, name: str) -> Schedule:
        """One schedule."""
        return self._schedule_repo().get(name=self._schedule_name(name))

    def list_schedules(self, *, limit: int, cursor: str | None) -> Page[Schedule]:
        """Schedules by name."""
        return self._schedule_repo().list_schedules(limit=limit, cursor=cursor)

    def pause_schedule(self, *, name: str) -> Schedule:
        """Stop deciding the schedule's slots."""
        return self._schedule_repo().pause(name=self._schedule_name(name))

    def resume_schedule(self, *, name: str) -> Schedule:
        """Decide slots again; the catch-up policy covers the paused span; wake the loop."""
        schedule = self._schedule_repo().resume(name=self._schedule_name(name))
        self._schedule_hooks.schedule_changed()
        return schedule

    def delete_schedule(self, *, name: str) -> None:
        """Delete the schedule and cancel its queued runs in the same transaction."""
        self._schedule_repo().delete(name=self._schedule_name(name))

    def list_decisions(
        self, *, name: str, limit: int, cursor: str | None
    ) -> Page[ScheduleDecision]:
        """The schedule's decisions, newest first."""
        return self._schedule_repo().decisions(
            name=self._schedule_name(name), limit=limit, cursor=cursor
        )

    def next_fires(self, schedule: Schedule) -> list[NextFire]:
        """The next 5 slots at or after the later of now and start_at_ms (also while paused)."""
        definition = schedule.definition
        after = max(now_ms(), definition.start_at_ms or 0) - 1
        return [
            NextFire(at_ms=at, local=local_iso(definition.timezone, at))
            for at in slots_after(spec_of(definition), after, NEXT_FIRES)
        ]

    def _schedule_repo(self) -> ScheduleRepository:
        if self._schedules is None:
            raise RuntimeError("this context was built without schedules")
        return self._schedules

    @staticmethod
    def _schedule_name(name: str) -> str:
        # Anything that breaks the name rule cannot name a schedule: 404, as for runs.
        try:
            return validate_name(name)
        except ValidationFailed:
            raise NotFound(ErrorCode.SCHEDULE_NOT_FOUND, "no such schedule") from None

    def _with_logs(self, run: Run) -> Run:
        if run.latest_attempt is None:
            return run
        return replace(run, latest_attempt=self._logs.with_log_info(run.latest_attempt))


def _refuse_expired(attempt: Attempt) -> None:
    if attempt.log is not None and attempt.log.expired:
        raise Gone(ErrorCode.LOG_EXPIRED, "retention removed this attempt's log")


def _check_revision(revision: int) -> None:
    if not 1 <= revision <= MAX_REVISION:
        raise ValidationFailed(ErrorCode.VALIDATION_FAILED, "revision must be 1..2147483647")


def _check_idempotency_key(idempotency_key: str | None) -> None:
    if idempotency_key is not None and not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
        raise ValidationFailed(
            ErrorCode.VALIDATION_FAILED, "Idempotency-Key must be 1..255 visible ASCII characters"
        )


def _check_run_id(run_id: str) -> None:
    # Anything that is not a UUIDv7 cannot name a run; answering here keeps odd bytes
    # (NUL, surrogates) away from the database driver.
    if not is_uuid7(run_id):
        raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")


def _loopback(base_url: str) -> bool:
    """Whether ``base_url`` reaches this machine itself: a loopback or unspecified address
    in any spelling a connect accepts (127.1, 2130706433, ::ffff:127.0.0.1, 0.0.0.0, ::),
    ``localhost`` (with its trailing dot, or a name under it), or a name that resolves here
    to one of those."""
    host = (urllib.parse.urlsplit(base_url).hostname or "").lower().rstrip(".")
    if not host or host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        found = [ipaddress.ip_address(host)]
    except ValueError:
        try:  # the C library's older IPv4 forms, which a connect accepts too
            found = [ipaddress.IPv4Address(socket.inet_aton(host))]
        except OSError:
            found = _resolved(host)  # a name: Debian's own host name is 127.0.1.1, say
    for address in found:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_loopback or address.is_unspecified:
            return True
    return False


def _resolved(name: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``name`` resolves to here (none when it does not: the forward then
    fails as unreachable anyway)."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
