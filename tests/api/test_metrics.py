"""GET /metrics: its scope, its figures from the database, and no task name in it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import Client, MakeToken


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_needs_its_scope_and_counts_runs_from_the_database(
    client: Client, make_token: MakeToken
) -> None:
    admin = {"Authorization": f"Bearer {make_token('admin')}"}
    task = "secret-project-name"
    r = client.put(f"/api/v1/tasks/{task}/revisions/1", json={"argv": ["/bin/true"]}, headers=admin)
    assert r.status_code == 201, r.text
    for _ in range(3):
        assert client.post("/api/v1/runs", json={"task": task}, headers=admin).status_code == 201

    assert client.get("/metrics").status_code == 401
    reader = {"Authorization": f"Bearer {make_token('runs:read')}"}
    denied = client.get("/metrics", headers=reader)
    assert denied.status_code == 403 and denied.json()["code"] == "FORBIDDEN"

    scraper = {"Authorization": f"Bearer {make_token('metrics:read')}"}
    r = client.get("/metrics", headers=scraper)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert task not in r.text  # labels are statuses and codes, never a task name
    got = _samples(r.text)
    assert got[("qinglong_runs", (("status", "queued"),))] == 3
    assert got[("qinglong_runs", (("status", "succeeded"),))] == 0
    assert got[("qinglong_queue_depth", ())] == 3
    assert got[("qinglong_attempts_active", (("status", "running"),))] == 0
    # Every journal state but consumed has its series at 0 before the first entry.
    journal = {dict(labels)["state"] for name, labels in got if name == "qinglong_journal_entries"}
    assert journal == {"reserved", "spawned", "spawn_failed", "quarantined", "fenced"}
    assert ("qinglong_created_to_started_seconds_count", ()) in got
    assert ("qinglong_dispatch_pass_seconds_count", ()) in got
