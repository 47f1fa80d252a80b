"""A log read forwarded to a host that is reachable but does not answer ends within its bounds.

A frozen host (its processes stopped, SIGSTOP) still has a kernel that accepts connections
and acknowledges what is sent: only the answer never comes. The forward
(app/adapters/log_proxy.py) must answer ``LogHostUnavailable`` (503 ``LOG_HOST_UNAVAILABLE``)
once ``ANSWER_TIMEOUT_S`` passed without the answer's status and headers, not after the read
timeout; and a body that started streaming keeps the read timeout between its reads, not
the answer's deadline (docs/several-hosts.md §5). Real sockets on 127.0.0.1; the timeouts
are shortened so that the code before this bound fails within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from app.adapters import log_proxy
from app.adapters.log_proxy import open_remote_log
from app.domain.errors import LogHostUnavailable

SLACK_S = 1.5  # the event loop's and the kernel's timers on a loaded host


@contextlib.contextmanager
def _listener() -> Iterator[socket.socket]:
    """A listening socket on 127.0.0.1 (a port the kernel picks) that nobody accepts on
    unless the test does."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock
    finally:
        sock.close()


def _open(port: int) -> log_proxy.RemoteLog:
    return asyncio.run(
        open_remote_log(
            base_url=f"http://127.0.0.1:{port}", path="/api/v1/runs/r/attempts/1/log",
            query="follow=true", headers={"authorization": "Bearer t"}, host="host-b",
        )
    )  # fmt: skip


def test_a_host_that_accepts_and_never_answers_is_unavailable_after_the_answer_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the answer's own deadline this waited the whole read timeout (30 s).
    monkeypatch.setattr(log_proxy, "READ_TIMEOUT_S", 3 * log_proxy.ANSWER_TIMEOUT_S + SLACK_S)
    with _listener() as frozen:  # listening, never accepting: the kernel does the handshake
        started = time.monotonic()
        with pytest.raises(LogHostUnavailable) as caught:
            _open(frozen.getsockname()[1])
        elapsed = time.monotonic() - started
        frozen.settimeout(0)
        conn, _ = frozen.accept()  # the connection was made: it is the answer that is missing
        conn.close()
    assert "host-b" in caught.value.detail
    assert log_proxy.ANSWER_TIMEOUT_S - 0.2 <= elapsed < log_proxy.ANSWER_TIMEOUT_S + SLACK_S


def test_a_body_silent_past_the_answer_timeout_still_streams_until_the_read_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log_proxy, "ANSWER_TIMEOUT_S", 1.0)  # room for a loaded host's answer
    monkeypatch.setattr(log_proxy, "READ_TIMEOUT_S", 4.0)
    done = threading.Event()
    with _listener() as listener:
        listener.settimeout(10)  # the thread ends even if no request ever comes

        def headers_then_stall() -> None:  # the other host: headers, then a late chunk
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                if done.wait(2 * log_proxy.ANSWER_TIMEOUT_S):  # silent past the deadline
                    return
                conn.sendall(b"5\r\nlate\n\r\n")
                done.wait(15)  # then silent for good, the connection open

        server = threading.Thread(target=headers_then_stall, daemon=True)
        server.start()

        async def read() -> tuple[int, bytes, float]:
            remote = await open_remote_log(
                base_url=f"http://127.0.0.1:{listener.getsockname()[1]}",
                path="/api/v1/runs/r/attempts/1/log", query="follow=true", headers={},
                host="host-b",
            )  # fmt: skip
            got, last = b"", time.monotonic()
            try:
                async for chunk in remote.body():
                    got, last = got + chunk, time.monotonic()
            finally:
                await remote.aclose()
            return remote.status, got, time.monotonic() - last

        try:
            status, got, silent_for = asyncio.run(read())
        finally:
            done.set()
            server.join(15)
    assert status == 200
    assert got == b"late\n"  # the deadline bounds the answer's start only, never the body
    # The body's silence then ends it after the read timeout, without an error.
    assert log_proxy.READ_TIMEOUT_S - 0.2 <= silent_for < log_proxy.READ_TIMEOUT_S + SLACK_S
