"""Limits a connection meets before its request reaches the app (docs/http-limits.md).

uvicorn bounds none of these itself: httptools buffers a request head of any size, neither
parser times out a head or a body that stops arriving (uvicorn's keep-alive timeout covers
only the pause between two requests, and nothing covers a connection that never sends), and
``limit_concurrency`` answers 503 to requests while every idle connection stays open.
``Limits`` adds them to a uvicorn HTTP protocol, per connection:

- the request line plus headers are counted as they arrive, before the parser sees them;
  over ``max_header_bytes`` the connection gets 431 ``HEADERS_TOO_LARGE`` and is closed, and
  the rest is never read (a 64 MiB head costs one socket read, not 64 MiB);
- a head must be complete within ``header_timeout_s`` of the connection's open (or of a
  keep-alive request's first byte): else 408 ``REQUEST_TIMEOUT`` and close (a connection
  that sent nothing at all is closed without an answer);
- while a request body is owed, a pause of ``body_timeout_s`` ends the connection (408 if no
  response started). Only the request body is timed: a long response (a log follow) is not;
- at ``max_connections`` open connections in this process, a new one closes the oldest that
  has no request in progress (idle keep-alive or an incomplete head), so a flood of idle or
  slow connections cannot lock clients out; when every connection has a request in progress
  the new one gets 503 ``TOO_MANY_CONNECTIONS`` and is closed;
- a connection is never switched to another protocol (WebSocket): the request is answered as
  HTTP, since a switched connection would leave the bound's count only at a restart.

The parser-specific parts (when a head or body is complete) are ``HttpToolsLimits`` (parser
callbacks) and ``H11Limits`` (h11's public connection state).
"""

from __future__ import annotations

import asyncio
import enum
import weakref
from typing import Any

import h11
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.server import ServerState

from app.api.framing import ProblemFraming
from app.api.problems import HEADERS_TOO_LARGE, REQUEST_TIMEOUT, TOO_MANY_CONNECTIONS
from app.settings import HttpLimits

DEFAULT_LIMITS = HttpLimits()
_HEAD_END = b"\r\n\r\n"


class _Phase(enum.Enum):
    IDLE = "idle"  # no byte of a request yet
    HEAD = "head"  # request line or headers incomplete
    BODY = "body"  # headers complete, body still owed
    DONE = "done"  # request fully received (the app runs, or the connection is kept alive)


_WAITING = (_Phase.IDLE, _Phase.HEAD)


class _Connections:
    """The connections of one uvicorn server (one api process) that the bound counts."""

    def __init__(self) -> None:
        self.open: set[Limits] = set()
        # Connections without a request in progress, oldest first (dicts keep insertion order).
        self.waiting: dict[Limits, None] = {}

    def forget(self, conn: Limits) -> None:
        self.open.discard(conn)
        self.waiting.pop(conn, None)


_by_server: weakref.WeakKeyDictionary[ServerState, _Connections] = weakref.WeakKeyDictionary()


class Limits(ProblemFraming):
    """Mixin for a uvicorn HTTP protocol: see the module docstring."""

    cycle: Any
    flow: FlowControl
    loop: asyncio.AbstractEventLoop

    def __init__(self, *args: Any, limits: HttpLimits = DEFAULT_LIMITS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._phase = _Phase.IDLE
        self._head_bytes = 0
        self._head_tail = b""  # the last bytes of the head so far: its end may span two reads
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0.0
        self._connections = _by_server.setdefault(self.server_state, _Connections())

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        connections = self._connections
        if len(connections.open) >= self.limits.max_connections and connections.waiting:
            next(iter(connections.waiting))._drop()
        if len(connections.open) >= self.limits.max_connections:
            self.send_problem_and_close(
                503, TOO_MANY_CONNECTIONS, "this api process has as many connections as it takes"
            )
            return
        connections.open.add(self)
        connections.waiting[self] = None
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_expired)

    def data_received(self, data: bytes) -> None:
        if self._phase is _Phase.BODY:
            self._body_seen = self.loop.time()
        elif self._head_bytes + len(data) > self.limits.max_header_bytes and not self._head_fits(
            data
        ):
            self._refuse(
                431,
                HEADERS_TOO_LARGE,
                f"the request line and headers exceed {self.limits.max_header_bytes} bytes",
            )
            return
        super().data_received(data)  # type: ignore[misc]
        self._settle(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)  # type: ignore[misc]

    # -- no protocol switch -----------------------------------------------------------------
    # uvicorn hands a WebSocket upgrade to another protocol object, and this one then never
    # gets its connection_lost: each upgrade kept a place in the bound for good, so as many
    # unauthenticated upgrade requests as the bound locked every client out (503). The api
    # has no WebSocket route, so an Upgrade header is ignored (RFC 9110 §7.8 lets a server)
    # and the request is answered as HTTP, problem+json included, without a log line each.
    # (`qinglong api` gives uvicorn ws="none" too, app/cli/serve.py; this covers uvicorn
    # started by class path, with its default WebSocket protocol.)

    def _should_upgrade_to_ws(self) -> bool:
        return False

    def _unsupported_upgrade_warning(self) -> None:
        cycle = self.cycle
        if cycle is not None and hasattr(cycle, "keep_alive"):
            # httptools parses nothing more on a connection once it saw an upgrade: close it
            # after this answer rather than leave a next request unanswered.
            cycle.keep_alive = False

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing() and self in self._connections.open:
            # Idle again: the youngest candidate for the bound to close.
            self._connections.waiting.pop(self, None)
            self._connections.waiting[self] = None
            self._settle(b"")  # h11 may have begun a pipelined request

    # -- the parser's progress -------------------------------------------------------------

    def _observe(self) -> None:
        """Update ``_phase`` from the parser (h11); httptools sets it from its callbacks.

        Either calls ``_head_complete`` when a request's headers are in.
        """

    def _settle(self, received: bytes) -> None:
        """Arm or cancel the timers for the phase the parser reached after ``received``."""
        if self.transport.is_closing():
            return
        self._observe()
        phase = self._phase
        if phase is _Phase.HEAD:
            self._head_bytes += len(received)
            self._head_tail = (self._head_tail + received)[-3:]
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(
                    self.limits.header_timeout_s, self._head_expired
                )
        elif phase is _Phase.BODY:
            if self._body_timer is None:
                self._body_seen = self.loop.time()
                self._body_timer = self.loop.call_later(
                    self.limits.body_timeout_s, self._body_check
                )
        elif phase is _Phase.DONE and self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _head_complete(self) -> None:
        """The headers are in: a request is in progress, no longer a candidate to close."""
        self._head_bytes = 0
        self._head_tail = b""
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._connections.waiting.pop(self, None)

    def _head_fits(self, data: bytes) -> bool:
        """Whether the head ends within the cap in ``data`` (rare: a read that crosses it)."""
        joined = self._head_tail + data
        end = joined.find(_HEAD_END)
        if end < 0:
            return False
        return self._head_bytes + end + len(_HEAD_END) - len(self._head_tail) <= (
            self.limits.max_header_bytes
        )

    # -- timers ----------------------------------------------------------------------------

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._phase is _Phase.HEAD:
            self._refuse(
                408,
                REQUEST_TIMEOUT,
                f"the request's headers did not arrive within {self.limits.header_timeout_s:g} s",
            )
        elif self._phase is _Phase.IDLE:
            self._drop()  # opened and never sent a byte: nobody to answer

    def _body_check(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self._phase is not _Phase.BODY:
            return
        now = self.loop.time()
        if self.flow.read_paused:
            # The app is not reading (its buffer is full): the pause is ours, not the client's.
            self._body_seen = now
        silent = now - self._body_seen
        if silent < self.limits.body_timeout_s:
            self._body_timer = self.loop.call_later(
                self.limits.body_timeout_s - silent, self._body_check
            )
            return
        if self.cycle is not None and self.cycle.response_started:
            # Answered already (a 413 from the Content-Length, say): a second answer to the
            # same request would be read as the answer to the next one.
            self._drop()
            return
        self._refuse(
            408,
            REQUEST_TIMEOUT,
            f"the request body stalled for {self.limits.body_timeout_s:g} s",
        )

    # -- ending a connection ---------------------------------------------------------------

    def _refuse(self, status: int, code: str, detail: str) -> None:
        """Answer ``status`` with problem+json and close; only close if a response is under way."""
        cycle = self.cycle
        writing = cycle is not None and cycle.response_started and not cycle.response_complete
        if cycle is not None and not cycle.response_complete:
            # From now on the app sees the client as gone (what connection_lost tells it), so
            # nothing it sends can follow this answer.
            cycle.disconnected = True
            cycle.message_event.set()
        self._forget()
        if writing:
            self.transport.close()
        else:
            self.send_problem_and_close(status, code, detail)

    def _drop(self) -> None:
        self._forget()
        self.transport.close()

    def _forget(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None
        self._connections.forget(self)


class HttpToolsLimits(Limits):
    """``Limits`` on uvicorn's httptools protocol: the parser's callbacks mark each phase."""

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        self._phase = _Phase.HEAD

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # type: ignore[misc]
        self._phase = _Phase.BODY  # on_message_complete follows in the same read if none is owed
        self._head_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()  # type: ignore[misc]
        self._phase = _Phase.DONE


class H11Limits(Limits):
    """``Limits`` on uvicorn's h11 protocol: the phase is h11's state of the client's side."""

    conn: h11.Connection

    def _observe(self) -> None:
        state = self.conn.their_state
        before = self._phase
        if state is h11.SEND_BODY:
            self._phase = _Phase.BODY
        elif state is h11.IDLE:
            # h11 holds the incomplete head in its buffer (only read here, where it is one).
            self._phase = _Phase.HEAD if self.conn.trailing_data[0] else _Phase.IDLE
        else:
            self._phase = _Phase.DONE
        if before in _WAITING and self._phase not in _WAITING:
            self._head_complete()
