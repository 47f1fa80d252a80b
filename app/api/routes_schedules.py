"""Schedules (docs/schedules.md, docs/api.md §9): definitions in, decisions out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Request, Response

from app.api.auth import Ctx, DefinitionsReader, DefinitionsWriter, SchedulesWriter
from app.api.http import READ_ERRORS, WRITE_ERRORS, PageQuery, problems
from app.api.schemas import (
    DecisionOut,
    DecisionPage,
    NextFireOut,
    ScheduleIn,
    ScheduleOut,
    SchedulePage,
)
from app.api.strict_json import StrictJSONRoute
from app.context.facade import AppFacade
from app.domain.model import Schedule
from app.domain.validation import NAME_PATTERN

router = APIRouter(prefix="/api/v1", tags=["schedules"], route_class=StrictJSONRoute)

ScheduleName = Annotated[str, Path(pattern=NAME_PATTERN, description="schedule name")]
IfMatch = Annotated[
    str | None,
    Header(
        alias="If-Match",
        max_length=128,
        description="ETag of the version this change replaces (stale: 412 PRECONDITION_FAILED)",
    ),
]


IfNoneMatch = Annotated[
    str | None,
    Header(
        alias="If-None-Match",
        max_length=128,
        description="`*`: create only; an existing schedule answers 412 PRECONDITION_FAILED",
    ),
]


def _out(facade: AppFacade, schedule: Schedule, response: Response) -> ScheduleOut:
    response.headers["ETag"] = schedule.etag
    fires = [NextFireOut(at_ms=f.at_ms, local=f.local) for f in facade.next_fires(schedule)]
    return ScheduleOut.of(schedule, fires)


@router.put(
    "/schedules/{name}",
    operation_id="schedules-put",
    response_model=ScheduleOut,
    status_code=201,
    responses=problems(
        *WRITE_ERRORS,
        409,
        412,
        extra={200: {"model": ScheduleOut, "description": "changed, or the same definition"}},
    ),
)
def put_schedule(
    name: ScheduleName,
    body: ScheduleIn,
    response: Response,
    facade: Ctx,
    _: SchedulesWriter,
    request: Request,
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
) -> ScheduleOut:
    """Create (201) or replace (200) a schedule; a change never fires a past slot."""
    # Several lines of one header are one list (RFC 9110 §5.3); the parameter holds the first.
    if if_match is not None:
        if_match = ", ".join(request.headers.getlist("if-match"))
    if if_none_match is not None:
        if_none_match = ", ".join(request.headers.getlist("if-none-match"))
    schedule, created = facade.put_schedule(
        name=name, definition=body.definition(), paused=body.paused, if_match=if_match,
        if_none_match=if_none_match,
    )  # fmt: skip
    response.status_code = 201 if created else 200
    return _out(facade, schedule, response)


@router.get(
    "/schedules",
    operation_id="schedules-list",
    response_model=SchedulePage,
    responses=problems(*READ_ERRORS),
)
def list_schedules(facade: Ctx, _: DefinitionsReader, paging: PageQuery) -> SchedulePage:
    """Schedules by name."""
    page = facade.list_schedules(limit=paging.limit, cursor=paging.cursor)

    def item(s: Schedule) -> ScheduleOut:
        fires = [NextFireOut(at_ms=f.at_ms, local=f.local) for f in facade.next_fires(s)]
        return ScheduleOut.of(s, fires)

    return paging.body(page, SchedulePage, item)


@router.get(
    "/schedules/{name}",
    operation_id="schedules-get",
    response_model=ScheduleOut,
    responses=problems(*READ_ERRORS),
)
def get_schedule(
    name: ScheduleName, response: Response, facade: Ctx, _: DefinitionsReader
) -> ScheduleOut:
    """One schedule with its next five fires."""
    return _out(facade, facade.get_schedule(name=name), response)


@router.post(
    "/schedules/{name}/pause",
    operation_id="schedules-pause",
    response_model=ScheduleOut,
    responses=problems(*READ_ERRORS),
)
def pause_schedule(
    name: ScheduleName, response: Response, facade: Ctx, _: DefinitionsWriter
) -> ScheduleOut:
    """Stop deciding slots until resumed."""
    return _out(facade, facade.pause_schedule(name=name), response)


@router.post(
    "/schedules/{name}/resume",
    operation_id="schedules-resume",
    response_model=ScheduleOut,
    responses=problems(*READ_ERRORS, 409),
)
def resume_schedule(
    name: ScheduleName, response: Response, facade: Ctx, _: SchedulesWriter
) -> ScheduleOut:
    """Decide slots again; the catch-up policy covers the paused span."""
    return _out(facade, facade.resume_schedule(name=name), response)


@router.delete(
    "/schedules/{name}",
    operation_id="schedules-delete",
    status_code=204,
    response_class=Response,
    responses=problems(*READ_ERRORS),
)
def delete_schedule(name: ScheduleName, facade: Ctx, _: SchedulesWriter) -> Response:
    """Delete the schedule; its queued runs are cancelled in the same transaction."""
    facade.delete_schedule(name=name)
    return Response(status_code=204)


@router.get(
    "/schedules/{name}/decisions",
    operation_id="schedules-decisions",
    response_model=DecisionPage,
    responses=problems(*READ_ERRORS),
)
def list_decisions(
    name: ScheduleName, facade: Ctx, _: DefinitionsReader, paging: PageQuery
) -> DecisionPage:
    """What became of each slot, newest first."""
    page = facade.list_decisions(name=name, limit=paging.limit, cursor=paging.cursor)
    return paging.body(page, DecisionPage, DecisionOut.of)
