"""Archiving a task over HTTP (docs/api.md §4), on both engines: hidden from the task list,
still readable, no new run or revision, its schedules paused first, a run already queued
left alone; unarchive undoes it. DELETE of a task says to archive it."""

from __future__ import annotations

from tests.api.conftest import Client, MakeToken, assert_problem

TASKS = "/api/v1/tasks"


def _names(client: Client, admin: dict[str, str], query: str = "") -> list[tuple[str, bool]]:
    got = client.get(f"{TASKS}{query}", headers=admin)
    assert got.status_code == 200, got.text
    return [(t["task"], t["archived"]) for t in got.json()["items"]]


def test_an_archived_task_is_hidden_readable_and_refuses_new_runs_until_unarchived(
    client: Client, admin: dict[str, str], make_token: MakeToken
) -> None:
    rev = {"argv": ["/bin/echo", "hi"]}
    for name in ("etl", "old"):
        assert client.put(f"{TASKS}/{name}/revisions/1", json=rev, headers=admin).status_code == 201
    queued = client.post("/api/v1/runs", json={"task": "old"}, headers=admin).json()
    reader = {"Authorization": f"Bearer {make_token('definitions:read', 'runs:write')}"}
    assert_problem(client.post(f"{TASKS}/old/archive", headers=reader), 403, "FORBIDDEN")

    archived = client.post(f"{TASKS}/old/archive", headers=admin)
    assert archived.status_code == 200, archived.text
    body = archived.json()
    assert body["archived"] is True and body["archived_at_ms"] > 0
    assert body["latest_revision"] == 1 and body["latest"]["argv"] == rev["argv"]
    again = client.post(f"{TASKS}/old/archive", headers=admin)  # idempotent: the same instant
    assert again.json()["archived_at_ms"] == body["archived_at_ms"]

    assert _names(client, admin) == [("etl", False)]
    assert _names(client, admin, "?archived=include") == [("etl", False), ("old", True)]
    assert _names(client, admin, "?archived=only") == [("old", True)]
    assert_problem(client.get(f"{TASKS}?archived=yes", headers=admin), 422, "VALIDATION_FAILED")
    assert client.get(f"{TASKS}/old", headers=admin).json()["archived"] is True
    assert client.get(f"{TASKS}/old/revisions", headers=admin).json()["items"][0]["revision"] == 1
    # The run queued before the archive goes on.
    assert client.get(f"/api/v1/runs/{queued['id']}", headers=admin).json()["status"] == "queued"

    refused = assert_problem(
        client.post("/api/v1/runs", json={"task": "old"}, headers=admin), 409, "TASK_ARCHIVED"
    )
    assert "unarchive" in refused["detail"]
    assert_problem(
        client.post(f"/api/v1/runs/{queued['id']}/rerun", headers=admin), 409, "TASK_ARCHIVED"
    )
    assert_problem(
        client.put(f"{TASKS}/old/revisions/2", json=rev, headers=admin), 409, "TASK_ARCHIVED"
    )
    assert client.put(f"{TASKS}/old/revisions/1", json=rev, headers=admin).status_code == 200

    deleted = client.delete(f"{TASKS}/old", headers=admin)
    problem = assert_problem(deleted, 405, "METHOD_NOT_ALLOWED")
    assert "POST /api/v1/tasks/{task}/archive" in problem["detail"]
    assert "DELETE" not in deleted.headers["allow"]

    restored = client.post(f"{TASKS}/old/unarchive", headers=admin)
    assert restored.status_code == 200
    assert restored.json()["archived"] is False and restored.json()["archived_at_ms"] is None
    assert _names(client, admin) == [("etl", False), ("old", False)]
    assert client.post("/api/v1/runs", json={"task": "old"}, headers=admin).status_code == 201
    assert_problem(client.post(f"{TASKS}/nope/archive", headers=admin), 404, "TASK_NOT_FOUND")


def test_archive_is_refused_while_a_schedule_that_is_not_paused_names_the_task(
    client: Client, admin: dict[str, str], task: str
) -> None:
    schedule = {"task": task, "every_seconds": 3600}
    for name in ("nightly", "hourly"):
        made = client.put(f"/api/v1/schedules/{name}", json=schedule, headers=admin)
        assert made.status_code == 201, made.text
    refused = assert_problem(
        client.post(f"{TASKS}/{task}/archive", headers=admin), 409, "TASK_HAS_SCHEDULES"
    )
    assert "(hourly, nightly)" in refused["detail"] and "pause or delete" in refused["detail"]
    assert client.get(f"{TASKS}/{task}", headers=admin).json()["archived"] is False

    client.post("/api/v1/schedules/nightly/pause", headers=admin)
    client.delete("/api/v1/schedules/hourly", headers=admin)
    assert client.post(f"{TASKS}/{task}/archive", headers=admin).status_code == 200
    # An archived task's schedules stay paused: no resume, no new schedule that would fire.
    assert_problem(
        client.post("/api/v1/schedules/nightly/resume", headers=admin), 409, "TASK_ARCHIVED"
    )
    assert_problem(
        client.put("/api/v1/schedules/weekly", json=schedule, headers=admin), 409, "TASK_ARCHIVED"
    )
    paused = client.put("/api/v1/schedules/weekly", json=schedule | {"paused": True}, headers=admin)
    assert paused.status_code == 201, paused.text
    assert client.post(f"{TASKS}/{task}/unarchive", headers=admin).status_code == 200
    assert client.post("/api/v1/schedules/nightly/resume", headers=admin).status_code == 200
