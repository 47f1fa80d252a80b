"""problem+json for the 400 uvicorn's HTTP parser writes itself for a request it cannot frame.

A request line or header the parser refuses (a bad ``Content-Length``, ``Content-Length``
beside ``Transfer-Encoding`` under httptools, a broken chunk, bytes that are not HTTP) never
reaches the app: uvicorn's protocol writes ``400`` with the plain-text body ``Invalid HTTP
request received.`` and closes. Every implementation does so through one method,
``send_400_response``; ``ProblemFraming`` overrides it to write the same answer as every other
refusal of the service: problem+json with the stable code ``MALFORMED_REQUEST``, then close.
The parser's own message is never echoed (h11's quotes client bytes).

The protocols ``qinglong api`` runs (app/api/retirement.py, on httptools or h11) take
``ProblemFraming`` as their first base. What stays plain text is listed in
docs/security-files-bodies.md.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.server import ServerState

from app.api.problems import MALFORMED_REQUEST, PROBLEM_MEDIA_TYPE, TYPE_PREFIX, title_of

_DETAIL = "the request's HTTP framing is not valid (request line, headers or body framing)"
_BODY = json.dumps(
    {
        "type": TYPE_PREFIX + MALFORMED_REQUEST,
        "title": title_of(MALFORMED_REQUEST),
        "status": 400,
        "detail": _DETAIL,
        "code": MALFORMED_REQUEST,
    }
).encode()
_HEAD = (
    b"content-type: " + PROBLEM_MEDIA_TYPE.encode() + b"\r\n"
    b"content-length: " + str(len(_BODY)).encode() + b"\r\n"
    b"connection: close\r\n\r\n"
)


class ProblemFraming:
    """Mixin for a uvicorn HTTP protocol: its parser's 400 is problem+json."""

    transport: asyncio.Transport
    server_state: ServerState

    def send_400_response(self, msg: str) -> None:
        """Write the problem+json 400 and close (``msg``, the parser's text, is dropped)."""
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        head += [name + b": " + value + b"\r\n" for name, value in self._default_headers()]
        # Written raw, as uvicorn's httptools protocol does: the connection ends right here,
        # whatever state the parser is in (h11's state machine may already be in ERROR).
        self.transport.write(b"".join(head) + _HEAD + _BODY)
        self.transport.close()

    def _default_headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.server_state.default_headers)  # date and server, as on every answer

