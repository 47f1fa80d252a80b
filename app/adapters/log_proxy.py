"""Reading a log from the host that ran its attempt (docs/several-hosts.md §5).

A log stays on the host whose worker ran the job: the database never names a path another
host cannot reach. An api asked for the log of
another host's attempt forwards the same request to that host's api, at the base URL its
lease row advertises, and streams the answer back unchanged (status, range and truncation
headers, bytes or SSE events). The forwarded request carries ``X-QL-Log-Forwarded`` so a
host that does not hold the log either (a misconfigured address) answers 503 instead of
forwarding again. A host whose answer has not started within ``ANSWER_TIMEOUT_S`` (its
status and headers: connecting, sending the request and receiving them, all told) is
``LogHostUnavailable`` (503 ``LOG_HOST_UNAVAILABLE``): one that is cut off, and one that
accepts the connection and never answers (a frozen process, its kernel still accepting).
So is a stream that breaks before its headers arrived. The body then streams with
``READ_TIMEOUT_S`` between two of its reads, longer than a follow's heartbeat; a body that
goes silent that long ends, without an error. httpx: the async client the test suite already
uses, kept and typed.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import anyio
import httpx

from app.domain.errors import LogHostUnavailable

FORWARDED_HEADER = "X-QL-Log-Forwarded"
# Request headers the log route reads; everything else stays here.
_REQUEST_HEADERS = ("authorization", "range", "last-event-id")
# Response headers of the log route worth passing on.
_RESPONSE_HEADERS = (
    "content-type", "content-length", "content-range", "accept-ranges", "cache-control",
    "x-log-truncated", "x-accel-buffering", "retry-after",
)  # fmt: skip
# From the start of the forward to the answer's status and headers: connect, send, wait.
ANSWER_TIMEOUT_S = 2.0
# Between two reads of the body, once the headers are in: longer than the follow's
# heartbeat (10 s), so a silent follow is still alive.
READ_TIMEOUT_S = 30.0


@dataclass
class RemoteLog:
    """An answer of the other host, its body still to stream (close it)."""

    status: int
    headers: dict[str, str]
    _response: httpx.Response
    _client: httpx.AsyncClient

    async def body(self) -> AsyncIterator[bytes]:
        """The body as it arrives; the connection is closed at the end (or on cancel)."""
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            return  # the other host went away mid-stream: the client sees the end
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the response and the client (idempotent)."""
        await self._response.aclose()
        await self._client.aclose()


@functools.cache
def _tls() -> ssl.SSLContext:
    """The one TLS context of this process: a client made with none loads the CA bundle into
    a new one, 27 ms of CPU on the event loop for every forwarded log read."""
    return httpx.create_ssl_context(trust_env=False)


async def open_remote_log(
    *, base_url: str, path: str, query: str, headers: Mapping[str, str], host: str | None
) -> RemoteLog:
    """Send the log request to ``base_url``; the answer with its body unread.

    Raises: LogHostUnavailable (no connection, an error, or no status and headers within
    ``ANSWER_TIMEOUT_S``).
    """
    forwarded = {k: v for k, v in headers.items() if k.lower() in _REQUEST_HEADERS}
    forwarded[FORWARDED_HEADER] = "1"
    # httpx's timeouts bound each operation (a connect, one read), not the answer: a host
    # that accepts and never answers would take the whole read timeout. So the answer's
    # start has a deadline of its own; the read timeout is left to the body.
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=ANSWER_TIMEOUT_S)
    client = httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, trust_env=False, verify=_tls()
    )
    url = f"{base_url.rstrip('/')}{path}" + (f"?{query}" if query else "")
    try:
        request = client.build_request("GET", url, headers=forwarded)
        with anyio.fail_after(ANSWER_TIMEOUT_S):
            response = await client.send(request, stream=True)
    except (httpx.HTTPError, TimeoutError):
        await client.aclose()
        raise LogHostUnavailable(host) from None
    kept = {k: v for k, v in response.headers.items() if k.lower() in _RESPONSE_HEADERS}
    return RemoteLog(status=response.status_code, headers=kept, _response=response, _client=client)
