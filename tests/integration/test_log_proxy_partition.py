"""A log read forwarded to another host behind a silent partition ends within its bounds.

The other host's api is a listener inside a network namespace (tests/kit/partition.py);
the partition drops packets both ways and refuses nothing, as a host cut off does. The
forward (app/adapters/log_proxy.py) must answer ``LogHostUnavailable`` (503
``LOG_HOST_UNAVAILABLE``) after its answer timeout (2 s), and a stream already under way must end
after its read timeout: never a request that waits for TCP (docs/several-hosts.md §5).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from app.adapters import log_proxy
from app.adapters.log_proxy import open_remote_log
from app.domain.errors import LogHostUnavailable
from tests.kit.partition import Partition, opened_partition

SLACK_S = 2.0  # the event loop's and the kernel's timers on a loaded host


@pytest.fixture
def partition() -> Iterator[Partition]:
    with opened_partition() as built:
        yield built


def _forward(base_url: str) -> log_proxy.RemoteLog:
    return asyncio.run(
        open_remote_log(
            base_url=base_url, path="/api/v1/runs/r/attempts/1/log", query="follow=true",
            headers={"authorization": "Bearer t"}, host="host-b",
        )
    )  # fmt: skip


def test_a_host_behind_a_silent_partition_is_unavailable_after_the_answer_timeout(
    partition: Partition,
) -> None:
    listener = partition.listener()  # an api that would answer, were it reachable
    partition.drop()
    started = time.monotonic()
    with pytest.raises(LogHostUnavailable) as caught:
        _forward(f"http://{partition.there}:{listener.getsockname()[1]}")
    elapsed = time.monotonic() - started
    # Not refused: waited, for the answer's deadline (or the connect timeout, the same 2 s).
    assert isinstance(caught.value.__context__, (TimeoutError, httpx.ConnectTimeout))
    assert log_proxy.ANSWER_TIMEOUT_S - 0.2 <= elapsed < log_proxy.ANSWER_TIMEOUT_S + SLACK_S


def test_a_follow_cut_off_mid_stream_ends_after_the_read_timeout(
    partition: Partition, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_proxy, "READ_TIMEOUT_S", 1.0)
    listener = partition.listener()
    listener.settimeout(10)  # the thread ends even if no request ever comes
    done = threading.Event()

    def follow_with_heartbeats() -> None:  # the other host: an event, then one every 0.2 s
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n6\r\nchunk\n\r\n"
            )
            until = time.monotonic() + 10  # a broken partition fails the test, never hangs it
            while not done.wait(0.2) and time.monotonic() < until:
                try:
                    conn.sendall(b"2\r\n:\n\r\n")  # a comment line, as a heartbeat is
                except OSError:
                    return

    server = threading.Thread(target=follow_with_heartbeats, daemon=True)
    server.start()
    try:

        async def follow() -> tuple[bytes, float]:
            remote = await open_remote_log(
                base_url=f"http://{partition.there}:{listener.getsockname()[1]}",
                path="/api/v1/runs/r/attempts/1/log", query="follow=true",
                headers={}, host="host-b",
            )  # fmt: skip
            try:
                assert remote.status == 200
                got = b""
                cut_at = 0.0
                async for chunk in remote.body():
                    got += chunk
                    if not cut_at and got.count(b":\n") >= 2:  # heartbeats do arrive
                        partition.drop()
                        cut_at = time.monotonic()
                return got, time.monotonic() - cut_at
            finally:
                await remote.aclose()

        got, after_cut = asyncio.run(follow())
        assert got.startswith(b"chunk\n")
        # Without the cut the heartbeats would keep it open; with it, the read timeout ends
        # the stream, without an error.
        assert log_proxy.READ_TIMEOUT_S - 0.2 <= after_cut < log_proxy.READ_TIMEOUT_S + SLACK_S
    finally:
        done.set()
        server.join(15)
    with socket.socket() as late:  # and the host stays cut off: nothing was refused
        late.settimeout(0.5)
        with pytest.raises(TimeoutError):
            late.connect((partition.there, listener.getsockname()[1]))
