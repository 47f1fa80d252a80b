"""The shim's drain alone (``_Drain``): the log's head, the ring of the output's last bytes
and the count of the bytes between, with chunks of every size against a small quota."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import tracemalloc
from pathlib import Path

import pytest

from app.worker import shim


def _drain(
    tmp_path: Path, quota: int, chunks: list[bytes], held: bytes = b"", tail_to: str | None = None
) -> shim._Drain:
    """Drain ``chunks`` into ``job.log`` (holding ``held`` first); ``tail_to``: a file the tail
    goes to instead when the job ends (``/dev/full``: a disk full by then)."""
    log = tmp_path / "job.log"
    log.write_bytes(held)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    read_fd, write_fd = os.pipe()
    drain = shim._Drain(fd, quota)
    try:
        for chunk in chunks:  # one read_once takes exactly one chunk: it fits the pipe
            os.write(write_fd, chunk)
            assert drain.read_once(read_fd)
        if tail_to is not None:
            os.close(drain.log_fd)
            fd = drain.log_fd = os.open(tail_to, os.O_WRONLY)
        drain.finish()
    finally:
        for each in (fd, read_fd, write_fd):
            os.close(each)
    return drain


@pytest.mark.parametrize("seed", range(20))
def test_the_log_keeps_the_head_and_the_last_bytes_whatever_the_chunks(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    quota = rng.choice([0, 1, 4, 100, 1000])
    output = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 3000)))
    cuts = sorted(rng.sample(range(1, len(output)), min(len(output) - 1, rng.randrange(1, 60))))
    chunks = [output[a:b] for a, b in zip([0, *cuts], [*cuts, len(output)], strict=True)]
    chunks = [c for c in chunks if c]
    drain = _drain(tmp_path, quota, chunks)
    log = (tmp_path / "job.log").read_bytes()
    head = quota - min(64 * 1024, quota // 4)
    if len(output) <= quota:
        assert (log, drain.dropped) == (output, 0)
    else:
        assert log == output[:head] + output[len(output) - (quota - head) :]
        assert drain.dropped == len(output) - quota and drain.gap_at == head
    assert len(log) <= quota and drain.reason == "quota"


@pytest.mark.parametrize("size", [1, 7, 249, 250, 251, 1000])
def test_the_ring_goes_round_in_order(tmp_path: Path, size: int) -> None:
    output = b"".join(b"%d\n" % i for i in range(1, 800))  # 3,089 bytes
    chunks = [output[i : i + size] for i in range(0, len(output), size)]
    drain = _drain(tmp_path, 1000, chunks)
    assert (tmp_path / "job.log").read_bytes() == output[:750] + output[-250:]
    assert (drain.dropped, drain.gap_at) == (len(output) - 1000, 750)


def test_bytes_already_in_the_log_count_against_the_head(tmp_path: Path) -> None:
    drain = _drain(tmp_path, 100, [b"a" * 30, b"b" * 30, b"c" * 30], held=b"x" * 90)
    log = (tmp_path / "job.log").read_bytes()
    assert log == b"x" * 90 + b"c" * 10  # no head left: the ring had the 10 bytes the quota left
    assert (drain.dropped, drain.gap_at) == (80, 90)


def test_a_tail_the_full_disk_refuses_is_counted_and_the_reason_says_so(tmp_path: Path) -> None:
    output = b"".join(b"%d\n" % i for i in range(1, 800))
    drain = _drain(tmp_path, 1000, [output[i : i + 100] for i in range(0, 3089, 100)],
                   tail_to="/dev/full")  # fmt: skip
    assert (tmp_path / "job.log").read_bytes() == output[:750]  # the head only
    assert (drain.dropped, drain.gap_at, drain.reason) == (len(output) - 750, 750, "disk_full")


def _finish_under_file_size_limit(drain: shim._Drain, limit: int) -> tuple[int, int | None, str]:
    """``drain.finish()`` in a forked child whose files may not grow past ``limit`` bytes
    (RLIMIT_FSIZE: a write crossing it takes the bytes below it, the next one fails EFBIG);
    the child's (dropped, gap_at, reason)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            drain.finish()
            os.write(write_fd, json.dumps([drain.dropped, drain.gap_at, drain.reason]).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        raw = os.read(read_fd, 1000)
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    dropped, gap_at, reason = json.loads(raw)
    return dropped, gap_at, reason


def test_a_tail_refused_part_way_moves_the_gap_to_the_logs_end(tmp_path: Path) -> None:
    # The ring went round: what the tail's write took is from the middle of the output, not
    # its end, so the gap is said where the log ends (readers then say "truncated at").
    output = b"".join(b"%d\n" % i for i in range(1, 800))  # 3,089 bytes
    log = tmp_path / "job.log"
    log.touch()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    read_fd, write_fd = os.pipe()
    try:
        drain = shim._Drain(fd, 1000)
        for i in range(0, len(output), 100):
            os.write(write_fd, output[i : i + 100])
            assert drain.read_once(read_fd)
        dropped, gap_at, reason = _finish_under_file_size_limit(drain, 800)
    finally:
        for each in (fd, read_fd, write_fd):
            os.close(each)
    kept = log.read_bytes()
    assert kept == output[:750] + output[-250:][:50]  # the head, then the tail's oldest 50 bytes
    assert (dropped, gap_at, reason) == (len(output) - 800, 800, "write_error")


def test_the_ring_takes_a_chunk_without_a_copy_of_it(tmp_path: Path) -> None:
    # A bytearray's slice assignment from a memoryview copies it into a temporary bytearray
    # first: a 64 KiB read past the head cost 64 KiB more of the shim's heap, held after.
    log = tmp_path / "job.log"
    log.touch()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    read_fd, write_fd = os.pipe()
    chunk = bytes(shim.READ_CHUNK)
    try:
        drain = shim._Drain(fd, 1 << 20)  # its ring: 64 KiB
        for _ in range(16):  # the head (1 MiB less 64 KiB), then the ring's first chunk
            os.write(write_fd, chunk)
            assert drain.read_once(read_fd)
        assert drain.past == len(chunk)  # the ring was allocated and took one chunk
        os.write(write_fd, chunk)
        tracemalloc.start()
        try:
            assert drain.read_once(read_fd)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        for each in (fd, read_fd, write_fd):
            os.close(each)
    assert drain.past == 2 * len(chunk)
    assert peak < 4096, peak
