"""Budgets over HTTP (docs/concurrency-budgets.md): 429 QUEUE_FULL and a revision's max_concurrent."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.domain.profiles import EDGE
from app.settings import Settings
from tests.api.conftest import Client, assert_problem


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    """QL_MAX_QUEUED=3."""
    return Settings(data_dir=tmp_path, database_url=db_url, profile=EDGE, max_queued=3)


def test_a_post_beyond_the_queued_cap_is_429_queue_full_with_retry_after(
    client: Client, admin: dict[str, str], task: str
) -> None:
    """Three queued runs fill QL_MAX_QUEUED=3; the fourth POST is refused, nothing stored."""
    first = client.post(
        "/api/v1/runs", json={"task": task}, headers=admin | {"Idempotency-Key": "a"}
    )
    assert first.status_code == 201
    for _ in range(2):
        assert client.post("/api/v1/runs", json={"task": task}, headers=admin).status_code == 201

    refused = client.post("/api/v1/runs", json={"task": task}, headers=admin)
    body = assert_problem(refused, 429, "QUEUE_FULL")
    assert refused.headers["Retry-After"] == "5"
    assert "3 runs are queued" in body["detail"]
    assert len(client.get("/api/v1/runs", headers=admin).json()["items"]) == 3

    # A replay of a key that already made its run is not a new run: it still answers 200.
    replay = client.post(
        "/api/v1/runs", json={"task": task}, headers=admin | {"Idempotency-Key": "a"}
    )
    assert (replay.status_code, replay.json()["id"]) == (200, first.json()["id"])
    # A new key is a new run: refused like any other.
    fresh = client.post(
        "/api/v1/runs", json={"task": task}, headers=admin | {"Idempotency-Key": "b"}
    )
    assert_problem(fresh, 429, "QUEUE_FULL")

    # A cancelled run leaves the queue, so there is room again.
    assert (
        client.post(f"/api/v1/runs/{first.json()['id']}/cancel", headers=admin).status_code == 202
    )
    assert client.post("/api/v1/runs", json={"task": task}, headers=admin).status_code == 201


def test_a_revision_carries_max_concurrent_and_refuses_values_outside_1_to_1000(
    client: Client, admin: dict[str, str]
) -> None:
    url = "/api/v1/tasks/capped/revisions/{}"
    created = client.put(
        url.format(1), json={"argv": ["/bin/true"], "max_concurrent": 2}, headers=admin
    )
    assert created.status_code == 201, created.text
    assert created.json()["max_concurrent"] == 2
    assert client.get(url.format(1), headers=admin).json()["max_concurrent"] == 2
    plain = client.put(url.format(2), json={"argv": ["/bin/true"]}, headers=admin)
    assert plain.json()["max_concurrent"] is None
    for bad in (0, 1001, -3):
        refused = client.put(
            url.format(3), json={"argv": ["/bin/true"], "max_concurrent": bad}, headers=admin
        )
        assert_problem(refused, 422, "LIMIT_EXCEEDED")
    refused = client.put(
        url.format(3), json={"argv": ["/bin/true"], "max_concurrent": "2"}, headers=admin
    )
    assert_problem(refused, 422, "VALIDATION_FAILED")
