"""/metrics through a real ``qinglong serve --workers 2``: every scrape, whichever uvicorn
worker answers it, reports the same figures (docs/metrics.md)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ServeFactory, wait_until
from tests.e2e.kit import enqueue, put_task, wait_status
from tests.e2e.test_supervisor import uvicorn_workers

pytestmark = pytest.mark.e2e
RUNS = 4
SCRAPES = 10


def _figures(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def test_every_api_worker_scrapes_the_same_sums(serve_factory: ServeFactory, db_url: str) -> None:
    served = serve_factory(database_url=db_url, workers=2)
    api = served.service_pids()["api"]
    wait_until("two uvicorn workers", lambda: len(uvicorn_workers(api)) == 2, 30)
    put_task(served, "m", "exit 3")
    ids = [enqueue(served, "m") for _ in range(RUNS)]
    for run_id in ids:
        assert wait_status(served, run_id, {"failed"})["latest_attempt"]["exit_code"] == 3
    # Both workers run the background dispatcher, so both have observed passes: each keeps
    # its histograms in its own file, and a scrape must sum them.
    files = served.data_dir / "metrics"
    wait_until(
        "histogram files of both workers",
        lambda: len({p.name for p in files.glob("histogram_*.db")}) >= 2,
        30,
    )
    for _ in range(SCRAPES):
        with httpx.Client(base_url=served.base_url, headers=served.auth, timeout=10) as fresh:
            r = fresh.get("/metrics")  # a new connection: any worker may accept it
        assert r.status_code == 200, r.text
        got = _figures(r.text)
        assert got["qinglong_created_to_started_seconds_count"] == RUNS
        assert got["qinglong_runs|status=failed"] == RUNS
        assert got["qinglong_runs_ended|error_code=|status=failed"] == RUNS
        assert got["qinglong_queue_depth"] == 0
        assert got["qinglong_dispatch_pass_seconds_count"] >= RUNS
