"""Retention: a task's policy, pins, and the storage figures (docs/retention.md, docs/api.md)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool

from app.api.auth import Admin, Ctx, DefinitionsReader, DefinitionsWriter, RunsWriter
from app.api.http import READ_ERRORS, WRITE_ERRORS, TaskName, problems
from app.api.schemas import (
    RetentionIn,
    RetentionOut,
    RetentionPolicyOut,
    RunOut,
    StorageOut,
    SweepOut,
)
from app.api.strict_json import StrictJSONRoute
from app.context.facade import StorageReport, TaskRetention
from app.domain.retention import TaskOverride

router = APIRouter(prefix="/api/v1", tags=["retention"], route_class=StrictJSONRoute)


def _retention_out(r: TaskRetention) -> RetentionOut:
    o, e = r.override, r.effective
    return RetentionOut(
        task=r.task,
        override=RetentionIn(
            keep_runs=o.keep_runs,
            keep_days=o.keep_days,
            keep_rows=o.keep_rows,
            task_log_bytes=o.task_log_bytes,
        ),
        effective=RetentionPolicyOut(
            keep_runs=e.keep_runs,
            keep_days=e.keep_days,
            keep_rows=e.keep_rows,
            task_log_bytes=e.task_log_bytes,
        ),
        retention_enabled=r.enabled,
    )


@router.get(
    "/tasks/{task}/retention",
    operation_id="tasks-get-retention",
    response_model=RetentionOut,
    responses=problems(*READ_ERRORS),
)
async def get_retention(task: TaskName, facade: Ctx, _: DefinitionsReader) -> RetentionOut:
    """The task's own retention fields (null: the global value) and the policy in force."""
    return _retention_out(await run_in_threadpool(facade.get_task_retention, task=task))


@router.put(
    "/tasks/{task}/retention",
    operation_id="tasks-put-retention",
    response_model=RetentionOut,
    status_code=200,
    responses=problems(
        *WRITE_ERRORS, extra={201: {"model": RetentionOut, "description": "the first policy"}}
    ),
)
async def put_retention(
    task: TaskName, body: RetentionIn, facade: Ctx, _: DefinitionsWriter, response: Response
) -> RetentionOut:
    """Replace the task's retention fields (201 the first time, then 200)."""
    override = TaskOverride(
        keep_runs=body.keep_runs,
        keep_days=body.keep_days,
        keep_rows=body.keep_rows,
        task_log_bytes=body.task_log_bytes,
    )
    result, created = await run_in_threadpool(
        facade.put_task_retention, task=task, override=override
    )
    response.status_code = 201 if created else 200
    return _retention_out(result)


@router.post(
    "/runs/{run_id}/pin",
    operation_id="runs-pin",
    response_model=RunOut,
    responses=problems(*READ_ERRORS),
)
async def pin_run(run_id: str, facade: Ctx, _: RunsWriter) -> RunOut:
    """Keep the run's logs and rows against every retention policy (idempotent)."""
    return RunOut.of(await run_in_threadpool(facade.pin_run, run_id=run_id, pinned=True))


@router.post(
    "/runs/{run_id}/unpin",
    operation_id="runs-unpin",
    response_model=RunOut,
    responses=problems(*READ_ERRORS),
)
async def unpin_run(run_id: str, facade: Ctx, _: RunsWriter) -> RunOut:
    """Let retention treat the run like any other again (idempotent)."""
    return RunOut.of(await run_in_threadpool(facade.pin_run, run_id=run_id, pinned=False))


def _storage_out(r: StorageReport) -> StorageOut:
    f = r.figures
    sweeps = [SweepOut.model_validate(s, from_attributes=True) for s in f.sweeps]
    return StorageOut(
        retention_enabled=r.retention_enabled,
        log_bytes=f.log_bytes,
        logs_kept=f.logs_kept,
        logs_expired=f.logs_expired,
        runs_kept=f.runs_kept,
        free_bytes=r.free_bytes,
        reserve_bytes=r.reserve_bytes,
        total_log_bytes_budget=r.total_log_bytes_budget,
        last_sweep=sweeps[0] if sweeps else None,
        sweeps=sweeps,
    )


@router.get(
    "/system/storage",
    operation_id="system-storage",
    response_model=StorageOut,
    responses=problems(401, 403),
)
async def storage(facade: Ctx, _: Admin) -> StorageOut:
    """Log bytes, runs kept, free space and the reserve, the last retention sweep (admin)."""
    return _storage_out(await run_in_threadpool(facade.storage))
