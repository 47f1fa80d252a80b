"""Fakes and builders for the execution-kernel tests (real databases, fake worker)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from app.adapters.worker_client import WorkerClient
from app.domain.errors import ErrorCode, LaunchFailed, NotFound, SecretsMissing
from app.domain.execution import LaunchRequest, StopResult
from app.domain.model import ProcessHandle, Recipe, Run, RunEvent, TaskRevision
from app.domain.profiles import EDGE, STANDALONE, Profile
from app.execution.coordinator import StartCoordinator
from app.execution.dispatcher import Dispatcher, build_dispatcher
from app.execution.materializer import LogSpares, Materializer
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import DispatchCandidate, RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tables import metadata

PLENTY = 1 << 50  # free bytes reported by the roomy fake disk


@dataclass(frozen=True)
class FakeSettings:
    """The settings the execution layer reads."""

    logs_dir: Path
    profile: Profile = STANDALONE

    @property
    def receipts_dir(self) -> Path:
        return self.logs_dir.parent / "receipts"


class FakeDisk:
    """Reports a fixed amount of free space and counts the probes."""

    def __init__(self, free: int = PLENTY, *, receipts: int | None = None) -> None:
        self.free = free
        self.receipts = receipts  # receipts/ as a file system of its own (None: the same)
        self.probed: list[Path] = []

    def free_bytes(self, path: Path) -> int:
        self.probed.append(path)
        if self.receipts is not None and path.name == "receipts":
            return self.receipts
        return self.free


class MemorySecrets:
    """In-memory secret store; records every resolve call (names only)."""

    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.values = dict(values or {})
        self.calls: list[frozenset[str]] = []

    def resolve(self, names: frozenset[str]) -> dict[str, str]:
        self.calls.append(names)
        missing = sorted(names - self.values.keys())
        if missing:
            raise SecretsMissing(missing)
        return {name: self.values[name] for name in names}


@dataclass(frozen=True)
class Observation:
    """What the database held at the moment the launcher was called."""

    request: LaunchRequest
    run: Run
    events: list[RunEvent]
    digest: str | None
    log_exists: bool


def fake_handle(n: int = 4242) -> ProcessHandle:
    """A well-formed handle of a process that does not exist."""
    return ProcessHandle(
        boot_id="boot-x", pid=n, pgid=n, start_ticks=7, shim_pid=n - 1, shim_start_ticks=6
    )


class FakeLauncher:
    """Records each launch and what the database held at that moment; thread-safe."""

    def __init__(
        self,
        engine: Engine,
        *,
        fail: str | None = None,
        handle: ProcessHandle | Callable[[LaunchRequest], ProcessHandle] | None = None,
        error: Exception | None = None,
    ) -> None:
        self._reader = RunReader(engine)
        self._engine = engine
        self.fail = fail
        self.error = error  # raised as is (e.g. LaunchUnavailable, LaunchRejected)
        self.handle = handle
        self.observed: list[Observation] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.observed)

    def launch(self, request: LaunchRequest) -> ProcessHandle:
        run = self._reader.get_run(request.run_id)
        events = self._reader.list_events(request.run_id).items
        with self._engine.connect() as conn:
            digest = conn.execute(
                text("SELECT callback_token_digest FROM attempts WHERE id = :i"),
                {"i": request.attempt_id},
            ).scalar_one()
        with self._lock:
            self.observed.append(
                Observation(request, run, events, digest, Path(request.log_path).exists())
            )
        if self.error is not None:
            raise self.error
        if self.fail is not None:
            raise LaunchFailed(self.fail)
        if callable(self.handle):
            return self.handle(request)
        return self.handle or fake_handle()


class FakeController:
    """Records stop calls, runs ``on_stop`` (to look at the database then) and answers."""

    def __init__(
        self,
        result: StopResult | Exception = "stopped",
        on_stop: Callable[[ProcessHandle], None] | None = None,
    ) -> None:
        self.result = result
        self.on_stop = on_stop
        self.calls: list[ProcessHandle] = []

    def stop(self, handle: ProcessHandle, *, grace_seconds: float) -> StopResult:
        self.calls.append(handle)
        if self.on_stop is not None:
            self.on_stop(handle)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class FlakyTransitions:
    """The real RunRepository, with record_running (T2) and fail_attempt failing on demand."""

    def __init__(
        self,
        engine: Engine,
        *,
        fail_t2: bool = False,
        fail_fail: bool = False,
        fail_requeue: bool = False,
    ) -> None:
        self._repo = RunRepository(engine)
        self.fail_t2 = fail_t2
        self.fail_fail = fail_fail
        self.fail_requeue = fail_requeue
        self.t2_calls = 0

    def begin_dispatch(self, **kwargs: Any) -> Run:
        return self._repo.begin_dispatch(**kwargs)

    def record_running(self, **kwargs: Any) -> Run:
        self.t2_calls += 1
        if self.fail_t2:
            raise RuntimeError("injected T2 failure")
        return self._repo.record_running(**kwargs)

    def fail_attempt(self, **kwargs: Any) -> Run:
        if self.fail_fail:
            raise RuntimeError("injected failure of the compensating write")
        return self._repo.fail_attempt(**kwargs)

    def requeue_unspawned(self, **kwargs: Any) -> Run:
        if self.fail_requeue:
            raise RuntimeError("injected failure of the requeue")
        return self._repo.requeue_unspawned(**kwargs)


class HidingDefinitions:
    """Real definitions with some revisions or recipes hidden (as if never published)."""

    def __init__(self, engine: Engine, *, hide_revision: bool = False, hide_recipe: bool = False):
        self._repo = DefinitionRepository(engine)
        self.hide_revision = hide_revision
        self.hide_recipe = hide_recipe

    def get_revision(self, task: str, revision: int) -> TaskRevision:
        if self.hide_revision:
            raise NotFound(ErrorCode.REVISION_NOT_FOUND, "hidden")
        return self._repo.get_revision(task, revision)

    def get_recipe(self, rid: str) -> Recipe:
        if self.hide_recipe:
            raise NotFound(ErrorCode.RECIPE_NOT_FOUND, "hidden")
        return self._repo.get_recipe(rid)


@dataclass
class Kit:
    """A dispatcher wired to a real database and fakes for everything outside it."""

    engine: Engine
    logs_dir: Path
    launcher: FakeLauncher
    controller: FakeController
    secrets: MemorySecrets
    disk: FakeDisk
    transitions: Any
    definitions: Any
    profile: Profile = STANDALONE
    max_running: int | None = None  # QL_MAX_RUNNING; None: no global budget
    spares: LogSpares | None = None  # the api's log file made ahead (None: none)
    dispatcher: Dispatcher = field(init=False)

    def __post_init__(self) -> None:
        self.dispatcher = build_dispatcher(
            candidates=RunReader(self.engine),
            definitions=self.definitions,
            secrets=self.secrets,
            transitions=self.transitions,
            launcher=self.launcher,
            controller=self.controller,
            settings_like=FakeSettings(self.logs_dir, self.profile),
            disk=self.disk,
            max_running=self.max_running,
            spares=self.spares,
        )

    def materializer(self) -> Materializer:
        """A materializer wired like the dispatcher's."""
        return Materializer(
            candidates=RunReader(self.engine),
            definitions=self.definitions,
            secrets=self.secrets,
            transitions=self.transitions,
            settings=FakeSettings(self.logs_dir, self.profile),
            disk=self.disk,
            spares=self.spares,
        )

    def coordinator(self) -> StartCoordinator:
        """A fresh one-shot coordinator wired like the dispatcher's."""
        return StartCoordinator(
            transitions=self.transitions,
            launcher=self.launcher,
            controller=self.controller,
            stop_grace_s=self.profile.stop_grace_s,
        )

    def candidate(self, run_id: str) -> DispatchCandidate:
        """The listed candidate of ``run_id``."""
        page = RunReader(self.engine).dispatch_candidates(limit=1000)
        return next(c for c in page.items if c.run_id == run_id)

    def run(self, run_id: str) -> Run:
        """The run as committed now."""
        return RunReader(self.engine).get_run(run_id)

    def events(self, run_id: str) -> list[RunEvent]:
        """All events of the run, in order."""
        return RunReader(self.engine).list_events(run_id, limit=1000).items


def make_kit(engine: Engine, logs_dir: Path, **overrides: Any) -> Kit:
    """A kit with roomy disk, empty secrets and a succeeding launcher unless overridden."""
    values: dict[str, Any] = {
        "launcher": FakeLauncher(engine),
        "controller": FakeController(),
        "secrets": MemorySecrets(),
        "disk": FakeDisk(),
        "transitions": RunRepository(engine),
        "definitions": DefinitionRepository(engine),
    }
    values.update(overrides)
    return Kit(engine=engine, logs_dir=logs_dir, **values)


def define(
    engine: Engine,
    task: str = "job",
    *,
    env: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
    recipe: bool = True,
    timeout_seconds: int | None = 60,
    priority: int = 0,
    revision: int = 1,
    max_concurrent: int | None = None,
) -> TaskRevision:
    """Store a recipe (unless ``recipe`` is false) and one revision of ``task``."""
    repo = DefinitionRepository(engine)
    rid = None
    if recipe:
        rid = repo.put_recipe(env=env or {}, secrets=secrets or {})[0].id
    rev, _ = repo.put_revision(
        task=task,
        revision=revision,
        executor="local_process",
        argv=["/bin/sh", "-c", "echo hi"],
        cwd=None,
        recipe=rid,
        timeout_seconds=timeout_seconds,
        priority=priority,
        max_concurrent=max_concurrent,
    )
    return rev


def enqueue(engine: Engine, task: str = "job", priority: int | None = None) -> Run:
    """Enqueue one run of the latest revision of ``task``."""
    run, created = RunRepository(engine).enqueue_run(task=task, revision=None, priority=priority)
    assert created
    return run


def all_database_text(engine: Engine) -> str:
    """Every value of every table, as one string (to search for leaked plaintext)."""
    chunks: list[str] = []
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(table.select()):
                chunks.append(repr(tuple(row)))
    return "\n".join(chunks)


def files_under(root: Path) -> list[Path]:
    """Every file below ``root`` (empty when it does not exist)."""
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


__all__ = ["EDGE", "STANDALONE"]


class CountingClient(WorkerClient):
    """The real worker client; counts pings (each one is a connect attempt) and, once the
    first one was answered, runs ``after_first_ping`` (a crash injected right there)."""

    def __init__(self, path: Path, *, after_first_ping: Callable[[], None] | None = None) -> None:
        super().__init__(path, connect_timeout_s=0.5)
        self.pings = 0
        self._after_first_ping = after_first_ping

    def ping(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        self.pings += 1
        answer = super().ping(timeout_s=timeout_s)
        hook, self._after_first_ping = self._after_first_ping, None
        if hook is not None:
            hook()
        return answer
