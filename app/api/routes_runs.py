"""Runs: enqueue and cancel intents in, state out (docs/api.md §6)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.concurrency import run_in_threadpool

from app.api.auth import Ctx, Reader, RunsWriter
from app.api.http import (
    READ_ERRORS,
    WRITE_ERRORS,
    PageQuery,
    problems,
    read,
    run_out,
)
from app.api.schemas import (
    AttemptOut,
    AttemptPage,
    EventOut,
    EventPage,
    RunIn,
    RunOut,
    RunPage,
    RunStatusName,
)
from app.api.strict_json import StrictJSONRoute
from app.domain.canonical import content_digest
from app.domain.validation import NAME_PATTERN

router = APIRouter(prefix="/api/v1", tags=["runs"], route_class=StrictJSONRoute)

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="same key + same body → the first response's run",
    ),
]

_SINCE = (
    "only runs created at or after this RFC 3339 instant with an offset "
    "(2026-12-07T03:00:00+08:00, 2026-12-06T19:00:00Z)"
)
_UNTIL = "only runs created before this RFC 3339 instant with an offset; later than since"


# Reads first: routes are matched in order, and these are the ones clients poll. Every route
# is async: a plain ``def`` route with a response model costs two worker-thread round trips
# (the endpoint, then its response validation); reads go through ``read`` (on the event loop
# on SQLite), writes to a worker thread (they may wait for the database's writer lock).
# ``get_run``'s plain 200 for a recently authenticated token is answered ahead of FastAPI by
# app/api/hot_reads.py; this route gives every other answer and the OpenAPI entry.


@router.get(
    "/runs/{run_id}",
    operation_id="runs-get",
    response_model=RunOut,
    responses=problems(*READ_ERRORS),
)
async def get_run(run_id: str, facade: Ctx, _: Reader) -> RunOut:
    """One run with its latest attempt; a queued one says what holds it back."""
    return await run_out(facade, await facade.get_run_async(run_id=run_id))


@router.get(
    "/runs",
    operation_id="runs-list",
    response_model=RunPage,
    responses=problems(*READ_ERRORS),
)
async def list_runs(
    facade: Ctx,
    _: Reader,
    paging: PageQuery,
    task: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    status: RunStatusName | None = None,
    schedule: Annotated[
        str | None,
        Query(pattern=NAME_PATTERN, description="only runs this schedule (by name) started"),
    ] = None,
    since: Annotated[str | None, Query(max_length=64, description=_SINCE)] = None,
    until: Annotated[str | None, Query(max_length=64, description=_UNTIL)] = None,
) -> RunPage:
    """Runs, newest first, filtered by task, status, schedule and a window of created time."""
    page = await read(
        facade,
        facade.list_runs,
        task=task,
        status=status,
        schedule=schedule,
        since=since,
        until=until,
        limit=paging.limit,
        cursor=paging.cursor,
    )
    return paging.body(page, RunPage, RunOut.of)


@router.get(
    "/runs/{run_id}/attempts",
    operation_id="runs-list-attempts",
    response_model=AttemptPage,
    responses=problems(*READ_ERRORS),
)
async def list_attempts(run_id: str, facade: Ctx, _: Reader) -> AttemptPage:
    """Every attempt of a run, by number (one page)."""
    attempts = await read(facade, facade.list_attempts, run_id=run_id)
    return AttemptPage(items=[AttemptOut.of(a) for a in attempts], next_cursor=None)


@router.get(
    "/runs/{run_id}/events",
    operation_id="runs-list-events",
    response_model=EventPage,
    responses=problems(*READ_ERRORS),
)
async def list_events(run_id: str, facade: Ctx, _: Reader, paging: PageQuery) -> EventPage:
    """A run's events in ``seq`` order."""
    page = await read(
        facade, facade.list_events, run_id=run_id, limit=paging.limit, cursor=paging.cursor
    )
    return paging.body(page, EventPage, EventOut.of)


@router.post(
    "/runs",
    operation_id="runs-create",
    status_code=201,
    response_model=RunOut,
    responses=problems(
        *WRITE_ERRORS,
        409,
        429,
        extra={200: {"model": RunOut, "description": "replay of an Idempotency-Key"}},
    ),
)
async def create_run(
    body: RunIn,
    facade: Ctx,
    principal: RunsWriter,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> RunOut:
    """Enqueue a run of a task revision (the latest when none is given)."""
    run, created = await run_in_threadpool(
        facade.enqueue_run,
        task=body.task,
        revision=body.revision,
        priority=body.priority,
        token_id=principal.token_id,
        idempotency_key=idempotency_key,
        request_digest=content_digest(body.model_dump()),
    )
    response.status_code = 201 if created else 200
    return RunOut.of(run)


@router.post(
    "/runs/{run_id}/rerun",
    operation_id="runs-rerun",
    status_code=201,
    response_model=RunOut,
    responses=problems(
        *READ_ERRORS,
        409,
        429,
        extra={200: {"model": RunOut, "description": "replay of an Idempotency-Key"}},
    ),
)
async def rerun(
    run_id: str,
    facade: Ctx,
    principal: RunsWriter,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> RunOut:
    """Enqueue a new run of the same task revision (trigger manual, rerun_of this run)."""
    run, created = await run_in_threadpool(
        facade.rerun,
        run_id=run_id,
        token_id=principal.token_id,
        idempotency_key=idempotency_key,
    )
    response.status_code = 201 if created else 200
    return RunOut.of(run)


@router.post(
    "/runs/{run_id}/cancel",
    operation_id="runs-cancel",
    status_code=202,
    response_model=RunOut,
    responses=problems(*READ_ERRORS, 409),
)
async def cancel_run(run_id: str, facade: Ctx, _: RunsWriter) -> RunOut:
    """Record the cancel intent (idempotent); 409 RUN_TERMINAL once the run ended."""
    return RunOut.of(await run_in_threadpool(facade.request_cancel, run_id=run_id))
