"""Retries and reruns over HTTP (docs/retries.md): a policy's bounds answer 422
INVALID_RETRY_POLICY naming the field, the stored policy reads back normalized, and a rerun
is a new manual run of the same revision, idempotent by key, 404 for an unknown run.
"""

from __future__ import annotations

from app.domain.canonical import content_digest
from tests.api.conftest import Client, MakeToken, assert_problem

URL = "/api/v1/tasks/flaky/revisions"


def test_a_retry_policy_is_checked_stored_and_read_back(
    client: Client, admin: dict[str, str]
) -> None:
    base = {"argv": ["/bin/true"]}
    for retry, field in [
        ({"max_attempts": 21}, "max_attempts"),
        ({"initial_delay_seconds": 90_000}, "initial_delay_seconds"),
        ({"initial_delay_seconds": 60, "max_delay_seconds": 5}, "max_delay_seconds"),
        ({"factor": 11}, "factor"),
        ({"on": ["succeeded"]}, "on"),
    ]:
        body = assert_problem(
            client.put(f"{URL}/1", json=base | {"retry": retry}, headers=admin),
            422, "INVALID_RETRY_POLICY",
        )  # fmt: skip
        assert field in body["detail"]
    assert_problem(
        client.put(f"{URL}/1", json=base | {"retry": {"tries": 2}}, headers=admin),
        422, "VALIDATION_FAILED",
    )  # fmt: skip
    plain = client.put(f"{URL}/1", json=base, headers=admin).json()
    assert plain["retry"] is None  # and its digest is the body's without the field:
    assert plain["digest"] == content_digest({
        "executor": "local_process", "argv": ["/bin/true"], "cwd": None, "recipe": None,
        "timeout_seconds": None, "priority": 0,
    })  # fmt: skip
    put = client.put(f"{URL}/2", json=base | {"retry": {"max_attempts": 3}}, headers=admin)
    assert put.status_code == 201, put.text
    assert put.json()["retry"] == {
        "max_attempts": 3, "initial_delay_seconds": 10, "factor": 2, "max_delay_seconds": 600,
        "jitter": False, "on": ["failed"],
    }  # fmt: skip
    same = {"max_attempts": 3, "initial_delay_seconds": 10.0, "on": ["failed"]}
    assert client.put(f"{URL}/2", json=base | {"retry": same}, headers=admin).status_code == 200


def test_a_rerun_is_a_new_manual_run_of_the_same_revision(
    client: Client, admin: dict[str, str], task: str, make_token: MakeToken
) -> None:
    run = client.post("/api/v1/runs", json={"task": task, "priority": 7}, headers=admin).json()
    url, key = f"/api/v1/runs/{run['id']}/rerun", {"Idempotency-Key": "k-1"}
    first = client.post(url, headers=admin | key)
    assert first.status_code == 201, first.text
    rerun = first.json()
    assert rerun["id"] != run["id"] and rerun["status"] == "queued"
    assert rerun["trigger"] == {"kind": "manual", "schedule": None, "slot_ms": None,
                                "rerun_of": run["id"]}  # fmt: skip
    assert (rerun["revision"], rerun["priority"], rerun["attempts"]) == (1, 7, 1)
    again = client.post(url, headers=admin | key)
    assert (again.status_code, again.json()["id"]) == (200, rerun["id"])
    other = f"/api/v1/runs/{rerun['id']}/rerun"
    assert_problem(client.post(other, headers=admin | key), 422, "IDEMPOTENCY_KEY_REUSED")
    unknown = "/api/v1/runs/01930000-0000-7000-8000-000000000000/rerun"
    assert_problem(client.post(unknown, headers=admin), 404, "RUN_NOT_FOUND")
    reader = {"Authorization": f"Bearer {make_token('runs:read')}"}
    assert_problem(client.post(url, headers=reader), 403, "FORBIDDEN")
