"""Several dispatchers on one database: compare-and-set alone makes every launch unique."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from tests.execution.kit import FakeLauncher, define, enqueue, make_kit

RUNS = 24
DISPATCHERS = 4
ROOT = Path(__file__).resolve().parents[2]


def _assert_all_running_once(engine: Engine, run_ids: list[str], launched: list[str]) -> None:
    reader = RunReader(engine)
    attempts = []
    for run_id in run_ids:
        run = reader.get_run(run_id)
        assert run.latest_attempt is not None
        assert (run.status, run.latest_attempt.status, run.version) == ("running", "running", 5)
        attempts.append(run.latest_attempt.id)
    counts = Counter(launched)
    assert sorted(counts) == sorted(attempts)
    assert set(counts.values()) == {1}


def test_passes_in_several_threads_launch_each_attempt_exactly_once(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    """Threads with their own dispatchers and engines race over one queue."""
    define(engine)
    run_ids = [enqueue(engine).id for _ in range(RUNS)]
    shared = FakeLauncher(engine)
    barrier = threading.Barrier(DISPATCHERS)
    errors: list[BaseException] = []
    engines = [make_engine(db_url) for _ in range(DISPATCHERS)]

    def work(own: Engine) -> None:
        try:
            kit = make_kit(own, tmp_path / "logs", launcher=shared)
            reader = RunReader(own)
            barrier.wait(timeout=30)
            for _ in range(RUNS * 20):
                if not reader.dispatch_candidates(limit=1).items:
                    return
                result = kit.dispatcher.run_pass()
                assert all(o.kind != "error" for o in result.outcomes), result
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(e,)) for e in engines]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
    finally:
        for own in engines:
            own.dispose()
    assert errors == []
    _assert_all_running_once(engine, run_ids, [o.request.attempt_id for o in shared.observed])


@pytest.mark.slow
def test_passes_in_several_processes_launch_each_attempt_exactly_once(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    """Separate OS processes (as uvicorn workers would be) race over one queue."""
    define(engine)
    run_ids = [enqueue(engine).id for _ in range(RUNS)]
    launch_log = tmp_path / "launches.txt"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.execution.pass_worker", db_url,
             str(tmp_path / "logs"), str(launch_log)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
        )
        for _ in range(DISPATCHERS)
    ]
    try:
        outputs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert [p.returncode for p in procs] == [0] * DISPATCHERS, outputs
    _assert_all_running_once(engine, run_ids, launch_log.read_text().split())
