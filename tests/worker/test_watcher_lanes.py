"""Live completion lanes: with ``lanes`` the watcher's callbacks run side by side.

Real processes stand in for shims (the watcher only needs a pidfd on a verified identity).
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from app.domain.model import ProcessHandle
from app.worker.identity import read_identity
from app.worker.watcher import ShimWatcher


def _handle(proc: subprocess.Popen[bytes]) -> ProcessHandle:
    identity = read_identity(proc.pid)
    assert identity is not None
    return ProcessHandle(
        boot_id=identity.boot_id, pid=proc.pid, pgid=identity.pgid,
        start_ticks=identity.start_ticks, shim_pid=proc.pid,
        shim_start_ticks=identity.start_ticks,
    )  # fmt: skip


@pytest.mark.parametrize(("lanes", "side_by_side"), [(3, True), (0, False)])
def test_endings_are_handled_side_by_side_only_with_lanes(lanes: int, side_by_side: bool) -> None:
    # Three shims exit together; each callback waits for the other two. On lanes they all
    # meet; on the watcher's own thread the first one waits alone and gives up.
    meet = threading.Barrier(3, timeout=1.5)
    seen: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def on_exit(run_id: str, attempt_id: str) -> None:
        try:
            meet.wait()
            met = True
        except threading.BrokenBarrierError:
            met = False
        with lock:
            seen.append((attempt_id, met))

    procs = [subprocess.Popen(["sleep", "0.3"]) for _ in range(3)]
    watcher = ShimWatcher(on_exit, lanes=lanes)
    watcher.start()
    try:
        for i, proc in enumerate(procs):
            watcher.add(f"run-{i}", f"attempt-{i}", _handle(proc))
        for proc in procs:
            proc.wait(5)
        deadline = time.monotonic() + 8
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watcher.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sorted(a for a, _ in seen) == ["attempt-0", "attempt-1", "attempt-2"]  # once each
    assert all(met for _, met in seen) is side_by_side


@pytest.mark.parametrize("lanes", [0, 2])
def test_stop_is_bounded_by_its_timeout_even_with_a_completion_stuck(lanes: int) -> None:
    # A completion stuck on the database must not hold the worker's shutdown (and so the
    # release of its lease) past the stop's timeout, on lanes or on the watcher's thread.
    entered = threading.Event()
    release = threading.Event()

    def on_exit(run_id: str, attempt_id: str) -> None:
        entered.set()
        release.wait(10)

    proc = subprocess.Popen(["sleep", "0.1"])
    watcher = ShimWatcher(on_exit, lanes=lanes)
    watcher.start()
    try:
        watcher.add("run", "attempt", _handle(proc))
        proc.wait(5)
        assert entered.wait(5)
        began = time.monotonic()
        watcher.stop(timeout=1.0)
        took = time.monotonic() - began
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert took < 2.0
