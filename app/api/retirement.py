"""A retiring api process lets its connections finish instead of cutting them.

See docs/rolling-restarts.md.

uvicorn's own shutdown closes every idle keep-alive connection at once. A client may have
sent its next request on that connection a moment earlier; it then sees a reset or an
empty answer although the server chose to stop. Here retirement is a state of the whole
process, entered when SIGTERM/SIGINT arrives (before uvicorn closes its listener) or when
uvicorn asks a connection to shut down, whichever comes first:

- every response that starts from then on carries ``Connection: close`` (``RetiringClose``
  in app/api/asgi.py reads ``retiring()``; CORS's preflights included), so the client opens
  its next request on a fresh connection, which the listening socket, shared by all workers
  of the manager, hands to a worker still serving;
- an idle connection, or one accepted just before the listener closed, is kept open for
  ``IDLE_GRACE_S`` so a request already on its way is answered (with ``Connection: close``);
  only an idle connection that stays silent for the whole grace is closed;
- a connection whose response already started without the header finishes it, then is
  idle and gets the grace like any other.

uvicorn still bounds the whole shutdown by its graceful timeout, which must exceed the grace.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, cast

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.http_limits import H11Limits, HttpToolsLimits, Limits
from app.settings import HttpLimits

# Longer than a client's pause between two requests, shorter than uvicorn's graceful bound.
IDLE_GRACE_S = 2.0

_retiring = threading.Event()
_armed = False


def retiring() -> bool:
    """True once this process has begun to retire."""
    return _retiring.is_set()


def begin() -> None:
    """Enter retirement (idempotent, safe from a signal handler)."""
    _retiring.set()


def arm_on_signals() -> None:
    """Enter retirement when SIGTERM or SIGINT arrives, then run uvicorn's own handler.

    Called from the lifespan, after uvicorn installed its handlers; only the main thread
    may set handlers, so elsewhere (an in-process test client) it does nothing.
    """
    global _armed
    if _armed or threading.current_thread() is not threading.main_thread():
        return
    _armed = True
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if callable(previous):
            signal.signal(sig, _chained(previous))


_Handler = Callable[[int, FrameType | None], object]


def _chained(previous: _Handler) -> _Handler:
    def handler(signum: int, frame: FrameType | None) -> None:
        begin()
        previous(signum, frame)

    return handler


class _Retiring:
    """Retirement for a uvicorn HTTP protocol: the same attributes in its h11 and httptools
    implementations (``cycle``, ``timeout_keep_alive_task``, ``timeout_keep_alive_handler``)."""

    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    timeout_keep_alive_task: asyncio.TimerHandle | None
    timeout_keep_alive_handler: Callable[[], None]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if retiring():  # accepted as the listener closed: a request may already be on its way
            self._idle_grace()

    def shutdown(self) -> None:
        """Called by uvicorn's server for each open connection when it stops."""
        begin()
        if self._idle():
            self._idle_grace()
        # A request in progress finishes; on_response_complete arms the grace if it is
        # still open (its response started before retirement, without the header).

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]  # may begin a pipelined request
        if retiring() and self._idle() and not self.transport.is_closing():
            self._idle_grace()

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _idle_grace(self) -> None:
        # The keep-alive timer's slot: the next request's bytes cancel it (data_received),
        # its expiry closes the connection exactly as an idle keep-alive timeout does.
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
        self.timeout_keep_alive_task = self.loop.call_later(
            IDLE_GRACE_S, self.timeout_keep_alive_handler
        )


# ProblemFraming (app/api/framing.py) comes first through the limits mixins.
class RetiringHttpToolsProtocol(HttpToolsLimits, _Retiring, HttpToolsProtocol):
    """uvicorn's httptools protocol: limits, a retiring shutdown, and its 400s as problem+json."""


class RetiringH11Protocol(H11Limits, _Retiring, H11Protocol):
    """The same on uvicorn's pure-Python h11 parser."""


PROTOCOLS: dict[str, type[Limits]] = {
    "httptools": RetiringHttpToolsProtocol,
    "h11": RetiringH11Protocol,
}


def http_protocol(limits: HttpLimits) -> type[asyncio.Protocol]:
    """What ``qinglong api`` hands uvicorn as ``http``: its parser's protocol with ``limits``.

    A partial, not a class: uvicorn only calls it (``Server.startup``) and reads
    ``alpn_protocols`` with ``getattr``, and a partial of a module-level class pickles by
    name, so the limits reach the worker processes uvicorn spawns inside its pickled Config.
    """
    return cast(type[asyncio.Protocol], functools.partial(PROTOCOLS[limits.parser], limits=limits))
