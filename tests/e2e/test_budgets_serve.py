"""QL_MAX_RUNNING through a real ``qinglong serve`` with two api workers
(docs/concurrency-budgets.md §2, §4). On SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from tests.e2e.conftest import ServeFactory, wait_until
from tests.e2e.kit import enqueue, get_run, put_task

pytestmark = pytest.mark.e2e

RUNS = 30
CAP = 2
# Each job marks itself in a directory while it runs and writes how many marks it saw.
JOB = "mkdir -p active; : > active/$$; ls active | wc -l >> seen; sleep 0.3; rm active/$$"


def test_thirty_posted_runs_never_run_more_than_max_running_at_once_and_all_succeed(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    """30 runs, QL_MAX_RUNNING=2, two api processes each dispatching: at most 2 jobs at once
    (seen by the jobs and by a database sampler), every run succeeds, and a freed slot is
    taken within the budget poll, not the 2 s slow loop."""
    served = serve_factory(database_url=db_url, workers=2, extra_env={"QL_MAX_RUNNING": str(CAP)})
    put_task(served, "budgeted", JOB, tmp_path)
    engine = make_engine(db_url)
    reader = RunReader(engine)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], reader.active_count())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run_ids = [enqueue(served, "budgeted") for _ in range(RUNS)]

        def runs() -> list[dict[str, Any]]:
            return [get_run(served, r) for r in run_ids]

        wait_until(
            "all 30 runs to end",
            lambda: all(r["status"] not in ("queued", "dispatching", "running") for r in runs()),
            120,
        )
    finally:
        done.set()
        sampler.join(timeout=10)
        engine.dispose()

    final = runs()
    assert {r["status"] for r in final} == {"succeeded"}
    seen = [int(line) for line in (tmp_path / "seen").read_text().split()]
    assert len(seen) == RUNS
    assert max(seen) <= CAP and peak[0] <= CAP
    assert peak[0] == CAP  # the budget was used in full, so the bound was tested
    # A freed slot is taken promptly: the gap from an ending to the next start.
    starts = sorted(int(r["started_at_ms"]) for r in final)
    ends = sorted(int(r["finished_at_ms"]) for r in final)
    gaps = [s - max(e for e in ends if e <= s) for s in starts[CAP:] if any(e <= s for e in ends)]
    assert statistics.median(gaps) < 500, gaps  # the 2 s slow loop alone gives ~1.7 s
