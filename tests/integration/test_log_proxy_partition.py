"""A log read forwarded to another host behind a silent partition ends within its bounds.

The other host's api is a listener inside a network namespace (tests/kit/partition.py);
the partition drops packets both ways and refuses nothing, as a host cut off does. The
forward (app/adapters/log_proxy.py) must answer ``LogHostUnavailable`` (503
``LOG_HOST_UNAVAILABLE``) after its connect timeout, and a stream already under way must end
after its read timeout: never a request that waits for TCP (docs/several-hosts.md §5).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from app.adapters import log_proxy
from app.adapters.log_proxy import open_remote_log
from app.domain.errors import LogHostUnavailable
from tests.kit.partition import Partition, skip_or_fail

SLACK_S = 2.0  # the event loop's and the kernel's timers on a loaded host


@pytest.fixture
def partition() -> Iterator[Partition]:
    built = Partition()
    try:
        try:
            built.open()
        except (OSError, subprocess.CalledProcessError) as exc:
            skip_or_fail(f"this host cannot build a network namespace with veth: {exc}")
        yield built
    finally:
        built.close()


def _forward(base_url: str) -> log_proxy.RemoteLog:
    return asyncio.run(
        open_remote_log(
            base_url=base_url, path="/api/v1/runs/r/attempts/1/log", query="follow=true",
            headers={"authorization": "Bearer t"}, host="host-b",
        )
    )  # fmt: skip


def test_a_host_behind_a_silent_partition_is_unavailable_after_the_connect_timeout(
    partition: Partition,
) -> None:
    listener = partition.listener()  # an api that would answer, were it reachable
    partition.drop()
    started = time.monotonic()
    with pytest.raises(LogHostUnavailable):
        _forward(f"http://{partition.there}:{listener.getsockname()[1]}")
    assert time.monotonic() - started < log_proxy.CONNECT_TIMEOUT_S + SLACK_S


def test_a_follow_cut_off_mid_stream_ends_after_the_read_timeout(
    partition: Partition, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_proxy, "READ_TIMEOUT_S", 1.0)
    listener = partition.listener()
    served = threading.Event()

    def serve_one_chunk() -> None:  # the other host: a follow that sends one event, then more
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n6\r\nchunk\n\r\n"
            )
            served.wait(30)  # held open: what it sends next never arrives

    server = threading.Thread(target=serve_one_chunk, daemon=True)
    server.start()
    try:

        async def follow() -> tuple[list[bytes], float]:
            remote = await open_remote_log(
                base_url=f"http://{partition.there}:{listener.getsockname()[1]}",
                path="/api/v1/runs/r/attempts/1/log", query="follow=true",
                headers={}, host="host-b",
            )  # fmt: skip
            assert remote.status == 200
            got: list[bytes] = []
            started = 0.0
            async for chunk in remote.body():
                got.append(chunk)
                partition.drop()  # cut off after the first event
                started = time.monotonic()
            return got, time.monotonic() - started

        got, after_cut = asyncio.run(follow())
        assert b"".join(got) == b"chunk\n"
        assert after_cut < log_proxy.READ_TIMEOUT_S + SLACK_S  # the stream ended, no error
    finally:
        served.set()
        server.join(10)
    with socket.socket() as late:  # and the host stays cut off: nothing was refused
        late.settimeout(0.5)
        with pytest.raises(TimeoutError):
            late.connect((partition.there, listener.getsockname()[1]))
