"""An attempt's log: bytes with Range/tail, or a resumable SSE follow (docs/api.md §7).

SSE wire form: ``event: chunk`` with ``id:`` the byte offset *after* the chunk (send it back
as ``Last-Event-ID`` to resume exactly there) and ``data: {"offset": <start>, "text": ...}``
(JSON, so CR/LF survive; chunks end on UTF-8 boundaries, undecodable bytes become U+FFFD —
read the raw bytes with ``Range``). ``: heartbeat`` comments keep proxies open. Once the
attempt is terminal and every byte was sent: ``event: end`` with ``{"status", "bytes"}``.
The file is polled only while somebody follows; a disconnect cancels the generator.

The stream's token is checked again before every poll, and between chunks once a poll's
interval has passed (a slow reader's poll may hold the whole quota), through the token cache,
so at most one database read per second per token: once it is revoked or no longer carries
``logs:read``, the stream sends ``event: error`` with ``{"code", "detail"}``
(``UNAUTHENTICATED`` or ``FORBIDDEN``) and ends, within a poll plus the cache's 1 s. Any other
refusal once the stream began ends it the same way (``LOG_EXPIRED``, ``LOG_MISSING``,
``RUN_NOT_FOUND``); a database outage ends it with only a comment, to be resumed.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from app.api import retirement
from app.api.auth import LOGS_SCOPE, Ctx, LogsReader, authenticated, bearer_token
from app.api.http import PLAIN_DIGITS, READ_ERRORS, problems
from app.api.problems import (
    FORBIDDEN,
    RANGE_NOT_SATISFIABLE,
    UNAUTHENTICATED,
    VALIDATION_FAILED,
    ApiProblem,
)
from app.api.schemas import Problem
from app.api.strict_json import StrictJSONRoute
from app.context.facade import LOG_FORWARDED_HEADER, AppFacade
from app.context.logs import LogFile
from app.domain.errors import DomainError, LogHostUnavailable, StorageUnavailable
from app.domain.states import TERMINAL_ATTEMPT

router = APIRouter(prefix="/api/v1", tags=["logs"], route_class=StrictJSONRoute)

CHUNK_BYTES = 64 * 1024
POLL_S = 0.5
HEARTBEAT_S = 10.0
_LOG_MEDIA = "text/plain; charset=utf-8"

_CONTENT = {
    "text/plain": {"schema": {"type": "string"}},
    "text/event-stream": {"schema": {"type": "string"}},
}


@router.get(
    "/runs/{run_id}/attempts/{number}/log",
    operation_id="runs-get-log",
    response_class=Response,
    responses=problems(
        *READ_ERRORS,
        410,
        416,
        extra={
            503: {
                "model": Problem,
                "description": (
                    "the attempt ran on another host, whose api does not answer within "
                    "2 s (LOG_HOST_UNAVAILABLE); or the database cannot take the request now "
                    "(STORAGE_UNAVAILABLE, DATABASE_UNREACHABLE, DATABASE_BUSY; with Retry-After)"
                ),
            },
            200: {
                "description": "the log bytes, or an SSE stream with follow=true",
                "content": _CONTENT,
            },
            206: {
                "description": "the requested byte range",
                "content": {"text/plain": _CONTENT["text/plain"]},
            },
        },
    ),
)
async def get_log(
    run_id: str,
    number: Annotated[int, Path(ge=1, le=2**31 - 1), PLAIN_DIGITS],
    request: Request,
    facade: Ctx,
    _: LogsReader,
    tail_bytes: Annotated[int | None, Query(ge=0, le=2**53), PLAIN_DIGITS] = None,
    follow: bool = False,
    range_header: Annotated[str | None, Header(alias="Range", max_length=256)] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
) -> Response:
    """Read an attempt's log (Range → 206, tail_bytes, follow=true → text/event-stream).

    An attempt another host ran is read from that host (docs/several-hosts.md §5).
    """
    resume = _resume_offset(last_event_id) if follow else None
    elsewhere = await run_in_threadpool(facade.log_host, run_id=run_id, number=number)
    if elsewhere is not None:
        return await _forward(facade, request, *elsewhere)
    log = await run_in_threadpool(facade.open_log, run_id=run_id, number=number)
    if follow:
        start = 0
        if resume is not None:
            start = resume
        elif tail_bytes is not None:
            start = max(0, log.size - tail_bytes)
        log.close()
        state = request.app.state
        stream = _follow(
            facade,
            token=bearer_token(request.headers.get("authorization", "")) or "",
            run_id=run_id,
            number=number,
            offset=start,
            poll_s=getattr(state, "log_poll_s", POLL_S),
            heartbeat_s=getattr(state, "log_heartbeat_s", HEARTBEAT_S),
        )
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        headers = {"Accept-Ranges": "bytes", "Cache-Control": "no-cache"}
        if log.truncated:
            headers["X-Log-Truncated"] = "true"
        status = 200
        start, end = 0, log.size
        if tail_bytes is not None:
            start = max(0, log.size - tail_bytes)
        elif range_header is not None:
            picked = _parse_range(range_header, log.size)
            if picked is not None:
                start, end = picked
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{log.size}"
    except BaseException:
        log.close()
        raise
    headers["Content-Length"] = str(end - start)
    return StreamingResponse(
        _read(log, start, end), status_code=status, media_type=_LOG_MEDIA, headers=headers
    )


async def _forward(facade: AppFacade, request: Request, base_url: str, host: str) -> Response:
    """The same request, answered by the host that holds the log, streamed back unchanged."""
    if request.headers.get(LOG_FORWARDED_HEADER):
        # Forwarded here, yet not ours either: never forward again (a loop), say so.
        raise LogHostUnavailable(host)
    remote = await facade.open_remote_log(
        base_url=base_url, host=host, path=request.url.path, query=request.url.query,
        headers=request.headers,
    )  # fmt: skip
    return StreamingResponse(remote.body(), status_code=remote.status, headers=remote.headers)


def _read(log: LogFile, start: int, end: int) -> Iterator[bytes]:
    """Yield ``[start, end)`` in chunks (run in a thread by Starlette), then close the file."""
    try:
        offset = start
        while offset < end:
            data = log.read(offset, min(CHUNK_BYTES, end - offset))
            if not data:
                return
            offset += len(data)
            yield data
    finally:
        log.close()


async def _follow(
    facade: AppFacade,
    *,
    token: str,
    run_id: str,
    number: int,
    offset: int,
    poll_s: float,
    heartbeat_s: float,
) -> AsyncIterator[str]:
    """The SSE body: chunks as the file grows, heartbeats, then ``end`` once terminal."""
    try:
        last_beat = time.monotonic()
        while True:
            await _check_token(facade, token)
            checked = time.monotonic()
            # Gone: retention removed it while somebody followed (any refusal ends the
            # stream the same way, below).
            log = await run_in_threadpool(facade.open_log, run_id=run_id, number=number)
            try:
                # The status was read before the size: terminal here means the file is complete.
                terminal = log.attempt.status in TERMINAL_ATTEMPT
                while offset < log.size and not retirement.retiring():
                    if time.monotonic() - checked >= poll_s:
                        # A slow reader may take minutes over one poll's bytes (up to the log's
                        # quota): the token is checked as often inside a poll as between polls.
                        await _check_token(facade, token)
                        checked = time.monotonic()
                    data = await run_in_threadpool(log.read, offset, CHUNK_BYTES)
                    cut = (
                        len(data)
                        if terminal and offset + len(data) >= log.size
                        else _utf8_cut(data)
                    )
                    if cut == 0:
                        break  # only part of a character so far: wait for the rest
                    text = data[:cut].decode("utf-8", errors="replace")
                    payload = json.dumps({"offset": offset, "text": text}, ensure_ascii=False)
                    offset += cut
                    last_beat = time.monotonic()
                    yield f"event: chunk\nid: {offset}\ndata: {payload}\n\n"
                size = log.size
                status = log.attempt.status
            finally:
                log.close()
            if terminal and offset >= size:
                payload = json.dumps({"status": status, "bytes": size})
                yield f"event: end\ndata: {payload}\n\n"
                return
            if retirement.retiring():
                # This process stops (serve's stop, a rolling restart): end here, as when the
                # database goes, rather than be cut at uvicorn's graceful bound 5 s later with
                # an ERROR line; the client resumes with Last-Event-ID on an api that serves.
                yield ": the api stops: the stream ends; resume with Last-Event-ID\n\n"
                return
            if time.monotonic() - last_beat >= heartbeat_s:
                last_beat = time.monotonic()
                yield ": heartbeat\n\n"
            await anyio.sleep(poll_s)
    except StorageUnavailable as exc:
        # The database went away (docs/api.md §2: a 503 for a new request). The stream ends
        # without an event, as when the api restarts: every client, older ones too, resumes
        # with Last-Event-ID and meets the 503s until it answers. A comment says why.
        yield f": {exc.code}: the stream ends; resume with Last-Event-ID\n\n"
    except (DomainError, _Refused) as exc:
        # A refusal once the stream began (the token revoked or without logs:read, the log
        # expired or went missing, the run deleted) is an error event with its code. Raised
        # on, it reached the exception handlers after the response started: a RuntimeError
        # and a cut stream.
        payload = json.dumps({"code": str(exc.code), "detail": exc.detail})
        yield f"event: error\ndata: {payload}\n\n"


class _Refused(Exception):
    """The follow's token may no longer read logs (``code``: UNAUTHENTICATED or FORBIDDEN)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code)
        self.code, self.detail = code, detail


async def _check_token(facade: AppFacade, token: str) -> None:
    """Raise ``_Refused`` once ``token`` may no longer read logs."""
    principal = await authenticated(facade, token) if token else None
    if principal is None:
        raise _Refused(UNAUTHENTICATED, "the token is unknown, revoked or expired")
    if not principal.can(LOGS_SCOPE):
        raise _Refused(FORBIDDEN, f"this token lacks the {LOGS_SCOPE} scope")


def _utf8_cut(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # continuation byte: keep looking for the lead byte
        if byte >> 5 == 0b110:
            need = 2
        elif byte >> 4 == 0b1110:
            need = 3
        elif byte >> 3 == 0b11110:
            need = 4
        else:
            need = 1
        return len(data) - back if need > back else len(data)
    return len(data)


def _resume_offset(last_event_id: str | None) -> int | None:
    """The offset a follow resumes at, from ``Last-Event-ID``; None when none was sent.

    Raises ApiProblem 422 for anything but an offset the stream sent: digits, spaces around.
    """
    if last_event_id is None:
        return None
    text = last_event_id.strip()
    if not _digits(text):
        # An EventSource sends back only an id the stream sent: anything else is a client's
        # bug, which starting at 0 (or at tail_bytes) would answer with the whole log again.
        raise ApiProblem(
            422, VALIDATION_FAILED,
            "header.Last-Event-ID: must be the id of a chunk this stream sent, a byte offset "
            "in digits (0-9); send none to start at the log's beginning or at tail_bytes",
        )  # fmt: skip
    return int(text)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` for one satisfiable ``bytes=`` range; None to ignore it.

    Raises ApiProblem 416 when the range is well-formed but unsatisfiable.
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None  # other units and multi-ranges: serve the whole log (RFC 9110 allows it)
    first, dash, last = spec.strip().partition("-")
    if not dash or not (_digits(first) or first == "") or not (_digits(last) or last == ""):
        return None
    if first == "":
        if last == "":
            return None
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise _unsatisfiable(size)
        return max(0, size - suffix), size
    start = int(first)
    end = int(last) + 1 if last else size
    if last and end <= start:
        return None
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(end, size)


def _digits(text: str) -> bool:
    # str.isdigit() accepts "²" and other Unicode digits that int() refuses.
    return text.isascii() and text.isdigit()


def _unsatisfiable(size: int) -> ApiProblem:
    return ApiProblem(
        416,
        RANGE_NOT_SATISFIABLE,
        f"the log has {size} bytes",
        headers={"Content-Range": f"bytes */{size}"},
    )
