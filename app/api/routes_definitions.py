"""Append-only definitions: recipes and task revisions (docs/api.md §4)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.auth import Ctx, DefinitionsReader, DefinitionsWriter
from app.api.http import (
    READ_ERRORS,
    WRITE_ERRORS,
    PageQuery,
    RevisionNo,
    TaskName,
    conditional_get,
    problems,
    strong_etag,
)
from app.api.schemas import (
    RecipeIn,
    RecipeOut,
    RevisionIn,
    RevisionOut,
    RevisionPage,
    TaskOut,
    TaskPage,
    TaskSummary,
)
from app.api.strict_json import StrictJSONRoute
from app.domain.model import ArchivedFilter, TaskRevision

router = APIRouter(prefix="/api/v1", tags=["definitions"], route_class=StrictJSONRoute)
_NOT_MODIFIED = {304: {"description": "the client's copy (If-None-Match) is current"}}


def _recipe_etag(recipe_id: str) -> str:
    return strong_etag(recipe_id.removeprefix("localctx:"))


@router.post(
    "/recipes",
    operation_id="recipes-create",
    status_code=201,
    response_model=RecipeOut,
    responses=problems(
        *WRITE_ERRORS, extra={200: {"model": RecipeOut, "description": "the same recipe exists"}}
    ),
)
def create_recipe(
    body: RecipeIn, facade: Ctx, _: DefinitionsWriter, response: Response
) -> RecipeOut:
    """Store a context recipe by content address (201 new, 200 same)."""
    recipe, created = facade.put_recipe(env=body.env, secrets=body.secrets)
    response.status_code = 201 if created else 200
    response.headers["ETag"] = _recipe_etag(recipe.id)
    return RecipeOut.of(recipe)


@router.get(
    "/recipes/{recipe_id}",
    operation_id="recipes-get",
    response_model=RecipeOut,
    responses=problems(*READ_ERRORS, extra=_NOT_MODIFIED),
)
def get_recipe(
    recipe_id: str, request: Request, facade: Ctx, _: DefinitionsReader, response: Response
) -> RecipeOut | Response:
    """One recipe; strong ETag, 304 on If-None-Match."""
    recipe = facade.get_recipe(recipe_id=recipe_id)
    return conditional_get(request, response, _recipe_etag(recipe.id)) or RecipeOut.of(recipe)


@router.put(
    "/tasks/{task}/revisions/{revision}",
    operation_id="tasks-put-revision",
    status_code=201,
    response_model=RevisionOut,
    responses=problems(
        *WRITE_ERRORS,
        409,
        extra={200: {"model": RevisionOut, "description": "the same revision exists"}},
    ),
)
def put_revision(
    task: TaskName,
    revision: RevisionNo,
    body: RevisionIn,
    facade: Ctx,
    _: DefinitionsWriter,
    response: Response,
) -> RevisionOut:
    """Append a task revision (201 new, 200 same, 409 REVISION_CONFLICT)."""
    rev, created = facade.put_revision(
        task=task,
        revision=revision,
        executor=body.executor,
        argv=body.argv,
        cwd=body.cwd,
        recipe=body.recipe,
        timeout_seconds=body.timeout_seconds,
        priority=body.priority,
        leftovers=body.leftovers,
        run_as=body.run_as,
        max_concurrent=body.max_concurrent,
        retry=body.retry.model_dump(exclude_unset=True) if body.retry is not None else None,
    )
    response.status_code = 201 if created else 200
    response.headers["ETag"] = strong_etag(rev.digest)
    return RevisionOut.of(rev)


@router.get(
    "/tasks",
    operation_id="tasks-list",
    response_model=TaskPage,
    responses=problems(*READ_ERRORS),
)
def list_tasks(
    facade: Ctx,
    _: DefinitionsReader,
    paging: PageQuery,
    archived: Annotated[
        ArchivedFilter,
        Query(description="archived tasks: left out (exclude), listed too (include), or only"),
    ] = "exclude",
) -> TaskPage:
    """Tasks by name with their latest revision number; archived ones only when asked."""
    page = facade.list_tasks(limit=paging.limit, cursor=paging.cursor, archived=archived)
    return paging.body(
        page,
        TaskPage,
        lambda t: TaskSummary(
            task=t.task,
            latest_revision=t.latest_revision,
            archived=t.archived_at_ms is not None,
            archived_at_ms=t.archived_at_ms,
        ),
    )


def _task_out(latest: TaskRevision, archived_at_ms: int | None) -> TaskOut:
    return TaskOut(
        task=latest.task,
        latest_revision=latest.revision,
        archived=archived_at_ms is not None,
        archived_at_ms=archived_at_ms,
        latest=RevisionOut.of(latest),
    )


@router.get(
    "/tasks/{task}",
    operation_id="tasks-get",
    response_model=TaskOut,
    responses=problems(*READ_ERRORS),
)
def get_task(task: TaskName, facade: Ctx, _: DefinitionsReader) -> TaskOut:
    """A task: its latest revision number and body, and whether it is archived."""
    return _task_out(*facade.get_task(task=task))


@router.post(
    "/tasks/{task}/archive",
    operation_id="tasks-archive",
    response_model=TaskOut,
    responses=problems(*READ_ERRORS, 409),
)
def archive_task(task: TaskName, facade: Ctx, _: DefinitionsWriter) -> TaskOut:
    """Archive the task (idempotent): hidden from the task list, no new run or revision; its
    revisions, runs and logs stay. 409 TASK_HAS_SCHEDULES while a schedule that is not
    paused names it."""
    return _task_out(*facade.archive_task(task=task, archived=True))


@router.post(
    "/tasks/{task}/unarchive",
    operation_id="tasks-unarchive",
    response_model=TaskOut,
    responses=problems(*READ_ERRORS),
)
def unarchive_task(task: TaskName, facade: Ctx, _: DefinitionsWriter) -> TaskOut:
    """Unarchive the task (idempotent): listed again, and runs may start."""
    return _task_out(*facade.archive_task(task=task, archived=False))


@router.get(
    "/tasks/{task}/revisions",
    operation_id="tasks-list-revisions",
    response_model=RevisionPage,
    responses=problems(*READ_ERRORS),
)
def list_revisions(
    task: TaskName, facade: Ctx, _: DefinitionsReader, paging: PageQuery
) -> RevisionPage:
    """Revisions of a task, newest first."""
    page = facade.list_revisions(task=task, limit=paging.limit, cursor=paging.cursor)
    return paging.body(page, RevisionPage, RevisionOut.of)


@router.get(
    "/tasks/{task}/revisions/{revision}",
    operation_id="tasks-get-revision",
    response_model=RevisionOut,
    responses=problems(*READ_ERRORS, extra=_NOT_MODIFIED),
)
def get_revision(
    task: TaskName,
    revision: RevisionNo,
    request: Request,
    facade: Ctx,
    _: DefinitionsReader,
    response: Response,
) -> RevisionOut | Response:
    """One immutable revision; strong ETag (its digest), 304 on If-None-Match."""
    rev = facade.get_revision(task=task, revision=revision)
    return conditional_get(request, response, strong_etag(rev.digest)) or RevisionOut.of(rev)
