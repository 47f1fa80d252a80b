"""A schedule through a real ``qinglong serve``: one run per slot, on time, until paused.

On SQLite and PostgreSQL (``db_url``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.conftest import Served, ServeFactory, wait_until
from tests.e2e.kit import TERMINAL, put_task
from tests.kit import web

pytestmark = pytest.mark.e2e

SECONDS = 8


def _runs(served: Served) -> list[dict[str, Any]]:
    r = web.get(f"{served.base_url}/api/v1/runs?limit=200", headers=served.auth, timeout=5)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def test_an_every_second_schedule_fires_one_run_per_slot_until_paused_then_is_deleted(
    serve_factory: ServeFactory, db_url: str
) -> None:
    served = serve_factory(database_url=db_url)
    put_task(served, "tick", "true")
    url = f"{served.base_url}/api/v1/schedules/every-second"
    body = {"task": "tick", "every_seconds": 1, "overlap": "allow", "max_concurrent": 10}
    created = web.put(url, json=body, headers=served.auth, timeout=5)
    assert created.status_code == 201, created.text
    time.sleep(SECONDS)

    paused = web.post(f"{url}/pause", headers=served.auth, timeout=5)
    assert (paused.status_code, paused.json()["paused"]) == (200, True)
    runs = _runs(served)
    slots = sorted(r["trigger"]["slot_ms"] for r in runs)
    assert len(slots) >= SECONDS - 2, slots
    assert slots == list(range(slots[0], slots[-1] + 1000, 1000)), "one run per slot, no gap"
    assert {(r["trigger"]["kind"], r["trigger"]["schedule"]) for r in runs} == {
        ("schedule", "every-second")
    }
    # A due slot's run exists within a second of its instant (docs/schedules.md §4).
    assert max(r["created_at_ms"] - r["trigger"]["slot_ms"] for r in runs) < 1000
    decisions = web.get(f"{url}/decisions?limit=200", headers=served.auth, timeout=5).json()
    fired = {d["run"] for d in decisions["items"] if d["decision"] == "fired"}
    assert fired == {r["id"] for r in runs}

    time.sleep(2.5)
    assert len(_runs(served)) == len(runs), "a paused schedule fires nothing"
    assert web.delete(url, headers=served.auth, timeout=5).status_code == 204
    assert web.get(url, headers=served.auth, timeout=5).status_code == 404
    wait_until(
        "every scheduled run to end",
        lambda: all(r["status"] in TERMINAL for r in _runs(served)),
        30,
    )
    assert {r["status"] for r in _runs(served)} == {"succeeded"}
