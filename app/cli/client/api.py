"""The HTTP side of the client commands: one httpx client, problem+json to one line, SSE.

Talks to the public REST API only (docs/api.md); the import contract "the cli client talks
HTTP only" keeps storage, execution and the api's own modules out of this package.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from app.cli.client.render import one_line

# Exit codes (docs/cli.md §4).
EXIT_OK = 0
EXIT_RUN_NOT_SUCCEEDED = 1
EXIT_USAGE = 2
EXIT_API_ERROR = 3
EXIT_UNREACHABLE = 4

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
# A follow sees a heartbeat every 10 s (docs/api.md §7); three missed ones mean a dead link.
FOLLOW_READ_TIMEOUT_S = 30.0
# How long a follow keeps reconnecting before it gives up (the api may be restarting).
RECONNECT_FOR_S = 60.0
API = "/api/v1"


class ClientError(Exception):
    """A problem the command reports as one line on stderr, with its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class Unreachable(ClientError):
    """The server could not be reached, or the connection broke."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_UNREACHABLE)


class ApiProblem(ClientError):
    """The API answered 4xx/5xx; ``code`` is its stable problem code (or None)."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message, EXIT_API_ERROR)
        self.status = status
        self.code = code


def public_url(url: str) -> str:
    """``url`` without user info (a password must not end up in a message)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid url>"
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def problem_message(status: int, reason: str, body: bytes, headers: httpx.Headers) -> ApiProblem:
    """The one-line error for a 4xx/5xx answer: ``<status> <CODE>: <detail>``."""
    code: str | None = None
    detail = ""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("code"), str):
        code = one_line(doc["code"], limit=64)
        detail = one_line(str(doc.get("detail") or doc.get("title") or ""))
    text = f"{status} {code}" if code else f"{status} {one_line(reason, limit=64)}".rstrip()
    if detail:
        text += f": {detail}"
    elif code is None:
        text += ": the answer is not a problem+json document (is --url the qinglong api?)"
    retry = headers.get("retry-after")
    if retry and retry.strip().isdigit():
        text += f" (retry after {int(retry)} s)"
    return ApiProblem(status, code, text)


def _transport_message(url: str, exc: httpx.HTTPError) -> str:
    where = public_url(url)
    check = "is the service running there (qinglong serve), and is --url (QL_URL) its address?"
    if isinstance(exc, httpx.ConnectTimeout):
        return f"cannot reach {where}: no answer within {CONNECT_TIMEOUT_S:.0f} s; {check}"
    if isinstance(exc, httpx.ConnectError):
        reason = one_line(str(exc), limit=120) or type(exc).__name__
        if "WRONG_VERSION_NUMBER" in reason:  # https:// against a server that speaks http
            return f"cannot reach {where}: it does not speak TLS; try http:// in --url"
        return f"cannot reach {where}: {reason}; {check}"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where} stopped answering (timed out)"
    return f"the connection to {where} failed ({type(exc).__name__})"


@dataclass(frozen=True)
class LogChunk:
    """One ``event: chunk`` of a follow: its text and the offset after it."""

    text: str
    next_offset: int


@dataclass(frozen=True)
class LogEnd:
    """The ``event: end`` of a follow: the attempt's terminal status."""

    status: str
    size: int


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, str, str | None]]:
    """``(event, data, id)`` per SSE event of ``lines``; comments (heartbeats) are skipped."""
    event, ident = "message", None
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data), ident
            event, data, ident = "message", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            ident = value
    if data:
        yield event, "\n".join(data), ident


class Client:
    """The API at ``url`` with ``token``; every failure is a ClientError."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        try:
            parts = urlsplit(self.url)
        except ValueError as exc:
            raise ClientError(f"invalid server url: {exc}", EXIT_USAGE) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(
                f"invalid server url {public_url(url)}: use http://HOST:PORT or https://HOST",
                EXIT_USAGE,
            )
        try:
            self._http = httpx.Client(
                base_url=self.url,
                headers={
                    # No token: only the unauthenticated /readyz (`qinglong system ready`).
                    **({"Authorization": f"Bearer {token}"} if token else {}),
                    "Accept": "application/json",
                    "User-Agent": "qinglong-cli",
                },
                timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                transport=transport,
            )
        except (httpx.InvalidURL, ValueError) as exc:
            raise ClientError(f"invalid server url {public_url(url)}: {exc}", EXIT_USAGE) from None
        except OSError as exc:  # httpx loads the CA certificates here, for http:// urls too
            raise ClientError(
                f"cannot load the CA certificates of SSL_CERT_FILE or SSL_CERT_DIR: {exc}",
                EXIT_USAGE,
            ) from None
        self._sleep = sleep

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plain requests ------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One request; a 4xx/5xx raises ApiProblem, a transport failure Unreachable."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(method, path, params=query, json=body, headers=headers)
        except httpx.UnsupportedProtocol:
            raise ClientError(
                f"invalid server url {public_url(self.url)}: use http:// or https://", EXIT_USAGE
            ) from None
        except httpx.HTTPError as exc:
            raise Unreachable(_transport_message(self.url, exc)) from None
        if response.status_code >= 400:
            raise problem_message(
                response.status_code, response.reason_phrase, response.content, response.headers
            )
        return response

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path`` under /api/v1; the decoded JSON."""
        return _json(self.request("GET", API + path, params=params))

    def get_root(self, path: str) -> Any:
        """GET ``path`` outside /api/v1 (``/readyz``); the decoded JSON."""
        return _json(self.request("GET", path))

    def post(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """POST ``path`` under /api/v1; the decoded JSON."""
        return self.create(path, body, headers=headers)[1]

    def create(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """POST ``path`` under /api/v1; ``(status, decoded JSON)``: 201 made, 200 an
        Idempotency-Key's replay (the run it made before)."""
        response = self.request("POST", API + path, body=body, headers=headers)
        return response.status_code, _json(response)

    def get_tagged(self, path: str) -> tuple[Any, str | None]:
        """GET ``path`` under /api/v1; ``(decoded JSON, its ETag)``."""
        response = self.request("GET", API + path)
        return _json(response), response.headers.get("etag")

    def put(
        self, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """PUT ``path`` under /api/v1; ``(status, decoded JSON)`` (201 new, 200 the same)."""
        response = self.request("PUT", API + path, body=body, headers=headers)
        return response.status_code, _json(response)

    def log_bytes(self, run_id: str, number: int) -> bytes:
        """The whole log of one attempt."""
        path = f"{API}/runs/{path_segment(run_id)}/attempts/{number}/log"
        return self.request("GET", path).content

    # -- following a log -----------------------------------------------------------------

    def follow(self, run_id: str, number: int, *, offset: int = 0) -> Iterator[LogChunk | LogEnd]:
        """The attempt's log as it is written, resuming at the last offset on reconnect.

        Ends after the LogEnd. A broken or silent connection is opened again with
        ``Last-Event-ID`` (the offset after the last chunk received), with backoff, for up to
        RECONNECT_FOR_S without any answer; then Unreachable.
        """
        path = f"{API}/runs/{path_segment(run_id)}/attempts/{number}/log"
        timeout = httpx.Timeout(FOLLOW_READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        failing_since: float | None = None
        delay = 0.25
        while True:
            headers = {"Accept": "text/event-stream"}
            if offset:
                headers["Last-Event-ID"] = str(offset)
            try:
                with self._http.stream(
                    "GET", path, params={"follow": "true"}, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise problem_message(
                            response.status_code,
                            response.reason_phrase,
                            response.content,
                            response.headers,
                        )
                    for event, data, ident in parse_sse(response.iter_lines()):
                        item = _follow_item(event, data, ident)
                        if item is None:
                            continue
                        failing_since, delay = None, 0.25
                        if isinstance(item, LogChunk):
                            offset = item.next_offset
                        yield item
                        if isinstance(item, LogEnd):
                            return
            except httpx.UnsupportedProtocol:
                raise ClientError(
                    f"invalid server url {public_url(self.url)}: use http:// or https://",
                    EXIT_USAGE,
                ) from None
            except ApiProblem as exc:
                # A restarting service may answer 503 for a moment; anything else is final.
                if exc.status != 503:
                    raise
                failing_since = _still_trying(failing_since, exc.message)
            except httpx.HTTPError as exc:
                failing_since = _still_trying(failing_since, _transport_message(self.url, exc))
            # The stream ended without ``end`` (the api restarted) or failed: resume.
            self._sleep(delay)
            delay = min(delay * 2, 5.0)


def _still_trying(since: float | None, message: str) -> float:
    now = time.monotonic()
    if since is None:
        return now
    if now - since > RECONNECT_FOR_S:
        raise Unreachable(f"{message}; gave up after {RECONNECT_FOR_S:.0f} s of reconnecting")
    return since


# A database outage is a 503, which the follow resumes through (RECONNECT_FOR_S), as when a
# follow cannot begin for it.
_FOLLOW_ERROR_STATUS = {
    "UNAUTHENTICATED": 401, "LOG_EXPIRED": 410, "LOG_MISSING": 410, "RUN_NOT_FOUND": 404,
    "ATTEMPT_NOT_FOUND": 404, "STORAGE_UNAVAILABLE": 503, "DATABASE_UNREACHABLE": 503,
    "DATABASE_BUSY": 503,
}  # fmt: skip


def _follow_item(event: str, data: str, ident: str | None) -> LogChunk | LogEnd | None:
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if event == "chunk" and ident is not None and ident.isdigit():
        return LogChunk(text=str(doc.get("text", "")), next_offset=int(ident))
    if event == "end":
        return LogEnd(status=str(doc.get("status", "")), size=int(doc.get("bytes") or 0))
    if event == "error":
        code = one_line(str(doc.get("code", "")), limit=64)
        detail = one_line(str(doc.get("detail", "")))
        # The status the same refusal has as an answer (docs/api.md §2), so the line reads
        # the same whether the follow began refused or was ended later.
        status = _FOLLOW_ERROR_STATUS.get(code, 403)
        raise ApiProblem(status, code, f"{status} {code}: {detail} (the log follow was ended)")
    return None


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise ClientError(
            f"{public_url(str(response.url))} answered {response.status_code} without JSON",
            EXIT_API_ERROR,
        ) from None


def path_segment(value: str) -> str:
    """One path segment, percent-encoded (a run id or a name typed by the user).

    A ``/`` reaches the api decoded (``%2F`` is ``/`` to its router) and ``.`` or ``..`` is
    resolved away by the url, so each would name another resource (``runs show .`` asked for
    the list of runs); no name or run id holds one, so it is refused before anything is sent.
    """
    if value in (".", "..") or "/" in value:
        raise ClientError(
            f"{one_line(value, limit=64)} is not a name or run id: none holds a / or is . or"
            " ..; nothing was sent",
            EXIT_USAGE,
        )
    return quote(value, safe="")
