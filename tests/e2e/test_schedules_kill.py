"""SIGKILLed api workers never fire a slot twice nor lose one (docs/schedules.md §2).

A real ``qinglong serve --workers 2`` (two scheduling loops racing) on SQLite and
PostgreSQL; an every-second schedule runs while uvicorn workers are SIGKILLed again and
again. Every slot from the first to the last decided has exactly one decision, and every
fired slot exactly one run.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Served, ServeFactory, wait_until
from tests.e2e.kit import TERMINAL, put_task
from tests.e2e.test_supervisor import uvicorn_workers
from tests.worker.kit import kill_exact

pytestmark = pytest.mark.e2e

KILLS = 4
BETWEEN_KILLS_S = 2.0


def _get(served: Served, path: str) -> dict[str, Any]:
    r = httpx.get(f"{served.base_url}{path}", headers=served.auth, timeout=10)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_sigkilled_api_workers_leave_exactly_one_decision_and_one_run_per_slot(
    serve_factory: ServeFactory, db_url: str
) -> None:
    served = serve_factory(database_url=db_url, workers=2)
    api = served.service_pids()["api"]
    wait_until("two uvicorn workers", lambda: len(uvicorn_workers(api)) == 2, 30)
    put_task(served, "tick", "true")
    url = f"{served.base_url}/api/v1/schedules/every-second"
    body = {
        "task": "tick", "every_seconds": 1, "overlap": "allow", "max_concurrent": 100,
        "catchup": "all",
    }  # fmt: skip
    assert httpx.put(url, json=body, headers=served.auth, timeout=5).status_code == 201
    for kill in range(KILLS):
        time.sleep(BETWEEN_KILLS_S)
        workers = uvicorn_workers(api)
        pid, ticks = sorted(workers.items())[kill % len(workers)]
        kill_exact(pid, ticks)
        # uvicorn's manager starts a new worker in the dead one's place.
        wait_until(
            "the killed worker replaced",
            lambda: len(uvicorn_workers(api)) == 2 and pid not in uvicorn_workers(api),  # noqa: B023
            60,
        )
    time.sleep(2)
    wait_until(
        "the pause to be answered",
        lambda: httpx.post(f"{url}/pause", headers=served.auth, timeout=5).status_code == 200,
        30,
    )

    decisions = _get(served, "/api/v1/schedules/every-second/decisions?limit=200")["items"]
    covered: list[int] = []
    for d in decisions:
        if d["decision"] == "missed":
            covered += range(d["slot_ms"], d["until_slot_ms"] + 1000, 1000)
        else:
            covered.append(d["slot_ms"])
    covered.sort()
    assert covered == list(range(covered[0], covered[-1] + 1000, 1000)), "one decision per slot"
    assert len(covered) >= KILLS * BETWEEN_KILLS_S - 2

    runs = _get(served, "/api/v1/runs?limit=200")["items"]
    fired = {d["slot_ms"]: d["run"] for d in decisions if d["decision"] == "fired"}
    assert {r["trigger"]["slot_ms"]: r["id"] for r in runs} == fired, "one run per fired slot"
    wait_until(
        "every scheduled run to end",
        lambda: all(
            r["status"] in TERMINAL for r in _get(served, "/api/v1/runs?limit=200")["items"]
        ),
        60,
    )
