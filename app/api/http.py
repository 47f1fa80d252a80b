"""Small HTTP helpers shared by the routes: list parameters, Link headers, ETags, docs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ParamSpec, TypeVar

from fastapi import Depends, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, BeforeValidator
from pydantic_core import PydanticCustomError

from app.api.schemas import Problem, RunOut
from app.context.facade import AppFacade
from app.domain.ids import now_ms
from app.domain.model import Page, Run
from app.domain.states import RunStatus
from app.domain.validation import NAME_PATTERN

P = ParamSpec("P")
T = TypeVar("T")
Item = TypeVar("Item")
PageOut = TypeVar("PageOut", bound=BaseModel)


def _plain_digits(value: object) -> object:
    """An integer in the query or the path as plain ASCII digits, for pydantic's int parsing
    to convert; any other spelling refused (``int_parsing``, as pydantic names an integer it
    cannot read)."""
    # Lax int parsing reads "5.0", "1_0", "+5" and " 5 " as numbers: a client that sends
    # them has a bug the answer should show. No integer parameter takes a negative.
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise PydanticCustomError(
            "int_parsing", "Input should be a whole number in plain decimal digits (0-9 only)"
        )
    return value


# Every integer parameter: ``Annotated[int, Query(<bounds>), PLAIN_DIGITS]`` (or ``Path``). After
# the ``Query``: before it, FastAPI's document says ``ge``/``le`` for ``minimum``/``maximum``.
PLAIN_DIGITS = BeforeValidator(_plain_digits)
Limit = Annotated[int, Query(ge=1, le=200, description="page size (1..200)"), PLAIN_DIGITS]
Cursor = Annotated[
    str | None, Query(min_length=1, max_length=512, description="opaque cursor of the next page")
]
TaskName = Annotated[str, Path(pattern=NAME_PATTERN, description="task name")]
SecretName = Annotated[str, Path(pattern=NAME_PATTERN, description="secret name")]
RevisionNo = Annotated[
    int, Path(ge=1, le=2**31 - 1, description="revision number"), PLAIN_DIGITS
]
DEFAULT_LIMIT = 50


def problems(
    *statuses: int, extra: Mapping[Any, Any] | None = None
) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries documenting problem+json answers (media type fixed in openapi);
    an entry of ``extra`` for one of ``statuses`` replaces the generic one."""
    out: dict[int | str, dict[str, Any]] = dict(extra or {})
    for status in statuses:
        if status not in out:
            out[status] = {"model": Problem, "description": _DESCRIPTIONS.get(status, "problem")}
    return out


_DESCRIPTIONS = {
    400: "malformed request (MALFORMED_JSON, MALFORMED_REQUEST)",
    401: "missing or unknown token (UNAUTHENTICATED)",
    403: "the token lacks the scope (FORBIDDEN)",
    404: "no such resource",
    409: "conflicts with what is stored",
    413: "body over 1 MiB (PAYLOAD_TOO_LARGE)",
    415: (
        "a body sent with a Content-Type other than JSON, or with a Content-Encoding other "
        "than identity (UNSUPPORTED_MEDIA_TYPE)"
    ),
    412: "If-Match names another version (PRECONDITION_FAILED)",
    410: "the attempt's log is gone: retention removed it (LOG_EXPIRED), or something outside "
    "the service did (LOG_MISSING)",
    416: "range not satisfiable",
    422: "validation failed (VALIDATION_FAILED, DUPLICATE_KEY or a specific code)",
    429: "QL_MAX_QUEUED runs are queued (QUEUE_FULL, with Retry-After)",
    503: (
        "the database cannot take the request now: it cannot store writes "
        "(STORAGE_UNAVAILABLE), did not answer (DATABASE_UNREACHABLE) or did not take it "
        "in time (DATABASE_BUSY); with Retry-After"
    ),
}

READ_ERRORS = (401, 403, 404, 422, 503)
WRITE_ERRORS = (400, 401, 403, 404, 413, 415, 422, 503)


def set_next_link(request: Request, response: Response, next_cursor: str | None) -> None:
    """``Link: <url>; rel="next"`` when there is a next page (docs/api.md §1)."""
    if next_cursor is not None:
        url = request.url.include_query_params(cursor=next_cursor)
        response.headers["Link"] = f'<{url}>; rel="next"'


@dataclass(frozen=True, slots=True)
class Paging:
    """A list route's page request (``limit``, ``cursor``) and what its answer needs."""

    request: Request
    response: Response
    limit: int
    cursor: str | None

    def body(self, page: Page[Item], model: type[PageOut], item: Callable[[Item], Any]) -> PageOut:
        """The page's body: each row through ``item``, the next cursor, its ``Link`` header."""
        set_next_link(self.request, self.response, page.next_cursor)
        return model(items=[item(row) for row in page.items], next_cursor=page.next_cursor)


async def _paging(
    request: Request, response: Response, limit: Limit = DEFAULT_LIMIT, cursor: Cursor = None
) -> Paging:
    # async: a plain ``def`` dependency would cost a worker-thread round trip per list.
    return Paging(request, response, limit, cursor)


PageQuery = Annotated[Paging, Depends(_paging)]


def strong_etag(digest: str) -> str:
    """A strong entity tag: the content digest, quoted."""
    return f'"{digest}"'


def matches_if_none_match(request: Request, etag: str) -> bool:
    """True when ``If-None-Match`` names ``etag`` (weak comparison, RFC 9110 §13.1.2) or ``*``."""
    header = ", ".join(request.headers.getlist("if-none-match"))  # lines are one list
    if not header:
        return False
    for candidate in header.split(","):
        tag = candidate.strip()
        if tag == "*":
            return True
        if tag.startswith("W/"):
            tag = tag[2:]
        if tag == etag:
            return True
    return False


def conditional_get(request: Request, response: Response, etag: str) -> Response | None:
    """A 304 when ``If-None-Match`` names ``etag``; else None and ``ETag`` on ``response``."""
    if matches_if_none_match(request, etag):
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    return None


async def read(facade: AppFacade, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Call a facade read: on the event loop where the facade allows it, else in a thread.

    A worker-thread round trip costs more than a SQLite run read (bench/api_reads.py), so
    async read routes call through here instead of being plain ``def`` routes.
    """
    if facade.reads_inline:
        return fn(*args, **kwargs)
    return await run_in_threadpool(fn, *args, **kwargs)


async def run_out(facade: AppFacade, run: Run) -> RunOut:
    """A run's answer: a queued one with what holds it back (``waiting``: a few more reads,
    through ``read``), any other, and a retry waiting for its time, from the run alone (the
    route and the hot read alike)."""
    if run.status != RunStatus.QUEUED.value or run.retry_waits(now_ms()):
        return RunOut.of(run)
    return RunOut.of(run, await read(facade, facade.run_waiting, run=run))
