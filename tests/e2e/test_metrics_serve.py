"""/metrics through a real ``qinglong serve --workers 2``: every scrape, whichever uvicorn
worker answers it, reports the same figures, those of the schedule loops too
(docs/metrics.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.cli.common import EXIT_DATA_DIR_IN_USE
from tests.e2e.conftest import REPO_ROOT, Served, ServeFactory, free_port, wait_until
from tests.e2e.kit import enqueue, put_task, wait_status
from tests.e2e.test_supervisor import uvicorn_workers
from tests.kit import web

pytestmark = pytest.mark.e2e
RUNS = 4
SCRAPES = 10
LATE = "qinglong_schedule_fire_lateness_seconds"


def _figures(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def _scrape(served: Served) -> dict[str, float]:
    # A new connection (any worker may accept it), one SSL context for the process.
    r = web.get(f"{served.base_url}/metrics", headers=served.auth, timeout=10)
    assert r.status_code == 200, r.text
    return _figures(r.text)


def _fires(got: dict[str, float]) -> float:
    return got[f"{LATE}_count|slot=on_time"] + got[f"{LATE}_count|slot=caught_up"]


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
        got = _scrape(served)
        assert got["qinglong_created_to_started_seconds_count"] == RUNS
        assert got["qinglong_runs|status=failed"] == RUNS
        assert got["qinglong_runs_ended|error_code=|status=failed"] == RUNS
        assert got["qinglong_queue_depth"] == 0
        assert got["qinglong_dispatch_pass_seconds_count"] >= RUNS

    # Both workers run a schedule loop; each slot is decided by one of them and its lateness
    # observed in that process's file (the one the PUT woke, mostly: the other sleeps up to
    # 30 s before it sees the new schedule). The count grows with the slots, and a scrape
    # answered by either worker reports every slot decided.
    assert _fires(got) == 0
    url = f"{served.base_url}/api/v1/schedules/every-second"
    body = {"task": "m", "every_seconds": 1, "overlap": "allow", "max_concurrent": 10}
    assert web.put(url, json=body, headers=served.auth, timeout=5).status_code == 201
    wait_until("three slots in the fire lateness count", lambda: _fires(_scrape(served)) >= 3, 30)
    assert web.post(f"{url}/pause", headers=served.auth, timeout=5).status_code == 200
    page = web.get(f"{url}/decisions?limit=200", headers=served.auth, timeout=5).json()
    decided = [d for d in page["items"] if d["decision"] != "missed"]
    assert len(decided) >= 3 and page["next_cursor"] is None
    # Lateness runs to the commit, which follows the decision's at_ms (its pass's clock).
    at_least = sum(d["at_ms"] - d["slot_ms"] for d in decided) / 1000 - 0.001 * len(decided)
    # A slot's decision is visible once committed; its loop observes it just after.
    wait_until("the last slot observed", lambda: _fires(_scrape(served)) == len(decided), 10)
    for _ in range(SCRAPES):
        got = _scrape(served)
        assert _fires(got) == len(decided)
        assert got[f"{LATE}_count|slot=on_time"] >= 1
        assert at_least <= got[f"{LATE}_sum|slot=on_time"] + got[f"{LATE}_sum|slot=caught_up"]
    assert "every-second" not in web.get(
        f"{served.base_url}/metrics", headers=served.auth, timeout=10
    ).text  # no schedule name in a label


def _refused(served: Served, command: str) -> subprocess.CompletedProcess[str]:
    """``qinglong <command>`` on ``served``'s data dir and another port: it must exit."""
    argv = [sys.executable, "-m", "app", command, "--host", "127.0.0.1"]
    argv += ["--port", str(free_port()), "--workers", "2", "--data-dir", str(served.data_dir)]
    return subprocess.run(
        argv, cwd=REPO_ROOT, env=served.env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_second_service_on_a_live_data_dir_is_refused_before_it_touches_its_metrics(
    serve_factory: ServeFactory,
) -> None:
    served = serve_factory(workers=2)
    api = served.service_pids()["api"]
    wait_until("two uvicorn workers", lambda: len(uvicorn_workers(api)) == 2, 30)
    put_task(served, "m", "true")
    wait_status(served, enqueue(served, "m"), {"succeeded"})
    files = served.data_dir / "metrics"
    before = {p.name: p.stat().st_ino for p in files.iterdir()}  # the same files, not new ones
    assert any(name.startswith("histogram_") for name in before)
    assert _scrape(served)["qinglong_created_to_started_seconds_count"] == 1

    for command, other in (("serve", "qinglong serve"), ("api", "qinglong api")):
        refused = _refused(served, command)
        assert {p.name: p.stat().st_ino for p in files.iterdir()} == before, refused.stderr
        for _ in range(SCRAPES):
            assert _scrape(served)["qinglong_created_to_started_seconds_count"] == 1
        assert refused.returncode == EXIT_DATA_DIR_IN_USE, refused.stderr
        assert refused.stderr == (
            f"qinglong: another {other} runs on the data dir {served.data_dir}; refusing to "
            "start (nothing of it was touched)\n"
        )
        assert refused.stdout == ""  # not even "database migrated"
    assert served.service_pids()["api"] == api and served.healthz_ok()
