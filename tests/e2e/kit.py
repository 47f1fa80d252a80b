"""HTTP helpers for end-to-end tests against a real ``qinglong serve``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.conftest import Served, wait_until
from tests.kit import web

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "lost"}
TERMINAL_EVENTS = {f"run.{s}" for s in TERMINAL}


def put_task(
    served: Served,
    name: str,
    script: str,
    cwd: Path | None = None,
    *,
    recipe: str | None = None,
    timeout_seconds: int | None = None,
    leftovers: str | None = None,
) -> None:
    """Define revision 1 of ``name`` as ``/bin/sh -c script``."""
    body: dict[str, Any] = {"executor": "local_process", "argv": ["/bin/sh", "-c", script]}
    if cwd is not None:
        body["cwd"] = str(cwd)
    if recipe is not None:
        body["recipe"] = recipe
    if timeout_seconds is not None:
        body["timeout_seconds"] = timeout_seconds
    if leftovers is not None:
        body["leftovers"] = leftovers
    r = web.put(
        f"{served.base_url}/api/v1/tasks/{name}/revisions/1", json=body, headers=served.auth
    )
    assert r.status_code in (200, 201), r.text


def enqueue(served: Served, task: str, *, key: str | None = None) -> str:
    """POST a run of ``task``; its id."""
    headers = dict(served.auth) | ({"Idempotency-Key": key} if key else {})
    r = web.post(f"{served.base_url}/api/v1/runs", json={"task": task}, headers=headers)
    assert r.status_code == 201, r.text
    run_id: str = r.json()["id"]
    return run_id


def get_run(served: Served, run_id: str) -> dict[str, Any]:
    """GET one run."""
    r = web.get(f"{served.base_url}/api/v1/runs/{run_id}", headers=served.auth, timeout=5)
    assert r.status_code == 200, r.text
    run: dict[str, Any] = r.json()
    return run


def wait_status(
    served: Served, run_id: str, statuses: set[str], timeout: float = 30
) -> dict[str, Any]:
    """Poll the run until its status is in ``statuses``."""
    wait_until(f"run in {statuses}", lambda: get_run(served, run_id)["status"] in statuses, timeout)
    return get_run(served, run_id)


def events(served: Served, run_id: str) -> list[dict[str, Any]]:
    """The run's events in seq order."""
    r = web.get(f"{served.base_url}/api/v1/runs/{run_id}/events", headers=served.auth)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def terminal_events(served: Served, run_id: str) -> list[str]:
    """The run's terminal run events (exactly one once it ended)."""
    return [e["type"] for e in events(served, run_id) if e["type"] in TERMINAL_EVENTS]


def read_log(served: Served, run_id: str, attempt: int = 1) -> bytes:
    """The attempt's whole log."""
    r = web.get(
        f"{served.base_url}/api/v1/runs/{run_id}/attempts/{attempt}/log", headers=served.auth
    )
    assert r.status_code == 200, r.text
    return r.content
