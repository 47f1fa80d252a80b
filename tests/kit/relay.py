"""A TCP relay to a database server that a test cuts and resumes.

``cut`` closes every relayed connection and the listener, so connecting is refused: what a
service sees of a PostgreSQL restart or of a network cut that resets. ``resume`` listens on
the same port again. Threads of this process, all joined by ``cut``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from sqlalchemy import make_url


class Relay:
    """Forwards 127.0.0.1:<port> (or the given listener's address) to a PostgreSQL server
    until ``cut``, then refuses."""

    def __init__(self, target: tuple[str, int], listener: socket.socket | None = None) -> None:
        """``listener``: where clients connect (default a new one on 127.0.0.1)."""
        self._target = target
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []  # the pumps
        self._acceptor: threading.Thread | None = None
        self._stop = threading.Event()
        self._own_listener = listener is None  # resume() makes another such one
        self._listener = listener or socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._serve()

    def _serve(self) -> None:
        self._stop.clear()
        self._listener.settimeout(0.05)
        self._acceptor = threading.Thread(target=self._accept, args=(self._listener,), daemon=True)
        self._acceptor.start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._stop.is_set():  # cut while this one was connecting: never relayed
                    client.close()
                    server.close()
                    return
                self._socks |= {client, server}
                for src, dst in ((client, server), (server, client)):
                    pump = threading.Thread(target=_pump, args=(src, dst), daemon=True)
                    pump.start()
                    self._threads.append(pump)

    def cut(self) -> None:
        """Close every relayed connection and the listener: connecting is refused."""
        self._stop.set()
        self._listener.close()
        if self._acceptor is not None:
            self._acceptor.join(5)  # no connection is added after this
            assert not self._acceptor.is_alive()
        with self._lock:
            socks, self._socks = self._socks, set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv
            sock.close()
        for thread in self._threads:
            thread.join(5)
        assert not any(t.is_alive() for t in self._threads)
        self._threads = []

    def resume(self) -> None:
        """Listen on the same port again (SO_REUSEADDR: create_server sets it)."""
        assert self._own_listener, "a relay on a given listener cannot listen again"
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._serve()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def relayed(url: str) -> Iterator[tuple[str, Relay]]:
    """``url`` through a new relay to its server (its host and port), and the relay."""
    parsed = make_url(url)
    relay = Relay((parsed.host or "127.0.0.1", parsed.port or 5432))
    try:
        yield parsed.set(port=relay.port).render_as_string(hide_password=False), relay
    finally:
        relay.cut()
