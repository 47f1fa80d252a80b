"""Retention's routes: bad input is a clear problem, scopes are enforced (docs/api.md §10)."""

from __future__ import annotations

import dataclasses

import pytest

from app.api.main import create_app
from app.settings import RetentionSettings, Settings
from tests.api.conftest import Client, MakeToken, assert_problem, at_once


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_retention_routes_validate_refuse_and_enforce_their_scopes(
    client: Client, admin: dict[str, str], make_token: MakeToken, task: str, settings: Settings
) -> None:
    url = f"/api/v1/tasks/{task}/retention"
    body = client.get(url, headers=admin).json()
    assert body["override"] == {
        "keep_runs": None, "keep_days": None, "keep_rows": None, "task_log_bytes": None
    }  # fmt: skip
    default = settings.profile.retention
    assert body["effective"]["keep_runs"] == default.keep_runs
    assert_problem(client.put(url, json={"keep_runs": 5, "keep_rows": 5}, headers=admin), 422,
                   "VALIDATION_FAILED")  # fmt: skip
    assert_problem(client.put(url, json={"keep_days": -1}, headers=admin), 422, "VALIDATION_FAILED")
    assert_problem(client.put(url, json={"keep_runs": "x"}, headers=admin), 422,
                   "VALIDATION_FAILED")  # fmt: skip
    assert_problem(client.put(url, json={"bogus": 1}, headers=admin), 422, "VALIDATION_FAILED")
    unknown = assert_problem(client.put("/api/v1/tasks/nope/retention", json={}, headers=admin),
                             404, "TASK_NOT_FOUND")  # fmt: skip
    # As GET says it (and every other route): it said "no such task".
    assert unknown["detail"] == "no task named nope"
    assert client.put(url, json={"keep_runs": 3}, headers=admin).status_code == 201
    again = client.put(url, json={"keep_runs": 4}, headers=admin)
    assert again.status_code == 200 and again.json()["effective"]["keep_runs"] == 4

    runs_reader = {"Authorization": f"Bearer {make_token('runs:read', 'definitions:read')}"}
    assert_problem(client.put(url, json={}, headers=runs_reader), 403, "FORBIDDEN")
    assert_problem(client.get("/api/v1/system/storage", headers=runs_reader), 403, "FORBIDDEN")
    run = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()
    assert_problem(client.post(f"/api/v1/runs/{run['id']}/pin", headers=runs_reader), 403,
                   "FORBIDDEN")  # fmt: skip
    assert_problem(client.post("/api/v1/runs/not-a-run/pin", headers=admin), 404, "RUN_NOT_FOUND")
    pinned = client.post(f"/api/v1/runs/{run['id']}/pin", headers=admin)
    assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    assert client.get(f"/api/v1/runs/{run['id']}", headers=admin).json()["pinned"] is True

    storage = client.get("/api/v1/system/storage", headers=admin).json()
    assert storage["runs_kept"] == 1 and storage["logs_expired"] == 0
    assert storage["reserve_bytes"] == settings.profile.free_space_reserve_bytes
    assert storage["last_sweep"] is None  # no worker in this test


def test_concurrent_first_puts_of_a_task_policy_are_one_201_and_no_500(
    client: Client, admin: dict[str, str], task: str
) -> None:
    # Before: on PostgreSQL a first put that lost the race to insert the task's row met the
    # primary key and answered 500.
    answers = at_once(client, [
        ("PUT", f"/api/v1/tasks/{task}/retention", {"json": {"keep_runs": i}, "headers": admin})
        for i in range(16)
    ])  # fmt: skip
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(201) == 1 and set(statuses) == {200, 201}, statuses


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_tasks_retention_says_when_the_service_sweeps_nothing(
    client: Client, admin: dict[str, str], task: str, settings: Settings
) -> None:
    # Under QL_RETENTION=off the answer's "effective" read as the policy in force (the CLI's
    # IN FORCE column), while no sweep ever applies it; the storage figures alone said so.
    url = f"/api/v1/tasks/{task}/retention"
    assert client.get(url, headers=admin).json()["retention_enabled"] is True
    off = dataclasses.replace(settings, retention=RetentionSettings(enabled=False))
    off_client = Client(create_app(off, execution=False))
    try:
        assert off_client.get(url, headers=admin).json()["retention_enabled"] is False
        put = off_client.put(url, json={"keep_runs": 3}, headers=admin).json()
        assert put["retention_enabled"] is False and put["effective"]["keep_runs"] == 3
        storage = off_client.get("/api/v1/system/storage", headers=admin).json()
        assert storage["retention_enabled"] is False
    finally:
        off_client.close()
