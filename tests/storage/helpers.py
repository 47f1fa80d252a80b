"""Small builders for storage tests."""

from __future__ import annotations

from sqlalchemy import Engine

from app.domain.canonical import sha256_digest
from app.domain.model import ProcessHandle, Run
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository

TOKEN = "callback-token-for-tests-0123456789"
HANDLE = ProcessHandle(
    boot_id="boot", pid=4242, pgid=4242, start_ticks=99, shim_pid=4241, shim_start_ticks=98
)


def define_task(engine: Engine, task: str = "job", revision: int = 1, priority: int = 0) -> None:
    """Store one revision of ``task`` running /bin/true."""
    DefinitionRepository(engine).put_revision(
        task=task,
        revision=revision,
        executor="local_process",
        argv=["/bin/true"],
        cwd=None,
        recipe=None,
        timeout_seconds=None,
        priority=priority,
    )


def enqueue(engine: Engine, task: str = "job", priority: int | None = None) -> Run:
    """Enqueue one run of ``task``."""
    run, created = RunRepository(engine).enqueue_run(task=task, revision=None, priority=priority)
    assert created
    return run


def dispatch(engine: Engine, run: Run) -> Run:
    """T1 for the run's latest attempt."""
    assert run.latest_attempt is not None
    return RunRepository(engine).begin_dispatch(
        run_id=run.id,
        attempt_id=run.latest_attempt.id,
        expected_version=run.version,
        token_digest=sha256_digest(TOKEN.encode()),
        deadline_at_ms=None,
        log_artifact_id="log:" + run.latest_attempt.id,
    )


def start(engine: Engine, run: Run) -> Run:
    """T1 then T2."""
    run = dispatch(engine, run)
    assert run.latest_attempt is not None
    return RunRepository(engine).record_running(
        run_id=run.id,
        attempt_id=run.latest_attempt.id,
        handle=HANDLE,
        started_at_ms=run.created_at_ms,
    )


def event_types(engine: Engine, run_id: str) -> list[str]:
    """The run's event types in seq order."""
    return [e.type for e in RunReader(engine).list_events(run_id).items]
