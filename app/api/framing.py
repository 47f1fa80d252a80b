"""problem+json for the 400 uvicorn's HTTP parser writes itself for a request it cannot frame.

A request line or header the parser refuses (a bad ``Content-Length``, ``Content-Length``
beside ``Transfer-Encoding`` under httptools, a broken chunk, bytes that are not HTTP) never
reaches the app: uvicorn's protocol writes ``400`` with the plain-text body ``Invalid HTTP
request received.`` and closes. Every implementation does so through one method,
``send_400_response``; ``ProblemFraming`` overrides it to write the same answer as every other
refusal of the service: problem+json with the stable code ``MALFORMED_REQUEST``, then close.
The parser's own message is never echoed (h11's quotes client bytes).

The protocols ``qinglong api`` runs (app/api/retirement.py, on httptools or h11) take
``ProblemFraming`` as their first base, through the limits mixins (app/api/http_limits.py),
which write their 431/408/503 with ``send_problem_and_close``. What stays plain text is listed in
docs/security-files-bodies.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from http import HTTPStatus

from uvicorn.server import ServerState

from app.api.problems import MALFORMED_REQUEST, PROBLEM_MEDIA_TYPE, problem_bytes

_DETAIL = "the request's HTTP framing is not valid (request line, headers or body framing)"


def raw_problem(
    status: int, code: str, detail: str, default_headers: Iterable[tuple[bytes, bytes]]
) -> bytes:
    """A whole problem+json response that ends its connection, as bytes for the transport."""
    body = problem_bytes(status, code, detail)
    head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [
        b"content-type: " + PROBLEM_MEDIA_TYPE.encode() + b"\r\n",
        b"content-length: " + str(len(body)).encode() + b"\r\n",
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


class ProblemFraming:
    """Mixin for a uvicorn HTTP protocol: its parser's 400 is problem+json."""

    transport: asyncio.Transport
    server_state: ServerState

    def send_400_response(self, msg: str) -> None:
        """Write the problem+json 400 and close (``msg``, the parser's text, is dropped)."""
        self.send_problem_and_close(400, MALFORMED_REQUEST, _DETAIL)

    def send_problem_and_close(self, status: int, code: str, detail: str) -> None:
        """End the connection with one problem+json answer, whatever the parser's state."""
        # Written raw, as uvicorn's httptools protocol does: the connection ends right here,
        # whatever state the parser is in (h11's state machine may already be in ERROR).
        # server_state's default headers: date and server, as on every answer.
        self.transport.write(raw_problem(status, code, detail, self.server_state.default_headers))
        self.transport.close()
