"""The schedules API: definitions with versions and ETags, next fires, decisions, errors."""

from __future__ import annotations

import itertools
import time
from typing import Any

from app.domain.ids import now_ms
from tests.api.conftest import Client, MakeToken, assert_problem, at_once

URL = "/api/v1/schedules/nightly"


def body(**kw: Any) -> dict[str, Any]:
    """A schedule of task ``hello`` every hour unless told otherwise."""
    return {"task": "hello", "every_seconds": 3600, **kw}


def test_put_creates_then_replaces_with_version_etag_and_next_fires(
    client: Client, admin: dict[str, str], task: str
) -> None:
    created = client.put(URL, json=body(), headers=admin)
    assert created.status_code == 201, created.text
    doc = created.json()
    assert (doc["name"], doc["version"], doc["overlap"], doc["catchup"]) == (
        "nightly", 1, "skip", "latest"
    )  # fmt: skip
    fires = [f["at_ms"] for f in doc["next_fires"]]
    assert len(fires) == 5 and fires[0] > now_ms() - 1000
    assert all(b - a == 3_600_000 for a, b in itertools.pairwise(fires))
    assert doc["next_fires"][0]["local"].endswith("+00:00")
    same = client.put(URL, json=body(), headers=admin)
    assert (same.status_code, same.json()["version"]) == (200, 1)
    assert same.headers["ETag"] == created.headers["ETag"]
    changed = client.put(
        URL, json=body(every_seconds=60), headers={**admin, "If-Match": created.headers["ETag"]}
    )
    assert (changed.status_code, changed.json()["version"]) == (200, 2)
    stale = client.put(
        URL, json=body(every_seconds=30), headers={**admin, "If-Match": created.headers["ETag"]}
    )
    assert_problem(stale, 412, "PRECONDITION_FAILED")
    got = client.get(URL, headers=admin)
    assert (got.json()["every_seconds"], got.headers["ETag"]) == (60, changed.headers["ETag"])
    # A list matches when one of its tags is the current one (RFC 9110 §13.1.1).
    listed = {**admin, "If-Match": f'"x", {changed.headers["ETag"]}'}
    assert client.put(URL, json=body(every_seconds=45), headers=listed).status_code == 200
    stale_list = {**admin, "If-Match": f'"x", {changed.headers["ETag"]}'}
    assert_problem(client.put(URL, json=body(every_seconds=40), headers=stale_list), 412,
                   "PRECONDITION_FAILED")  # fmt: skip
    current = client.get(URL, headers=admin).headers["ETag"]
    lines = [*admin.items(), ("If-Match", '"x"'), ("If-Match", current)]  # two header lines
    assert client.put(URL, json=body(every_seconds=50), headers=lines).status_code == 200
    weak = {**admin, "If-Match": "W/" + client.get(URL, headers=admin).headers["ETag"]}
    assert_problem(client.put(URL, json=body(every_seconds=40), headers=weak), 412,
                   "PRECONDITION_FAILED")  # fmt: skip
    star = {**admin, "If-Match": "*"}
    assert client.put(URL, json=body(every_seconds=30), headers=star).status_code == 200
    absent = client.put("/api/v1/schedules/absent", json=body(), headers=star)
    assert_problem(absent, 412, "PRECONDITION_FAILED")


def test_if_none_match_star_creates_only(
    client: Client, admin: dict[str, str], task: str
) -> None:
    # The UI's "new schedule" never replaces one made meanwhile (RFC 9110 §13.1.2).
    create_only = {**admin, "If-None-Match": "*"}
    assert client.put(URL, json=body(), headers=create_only).status_code == 201
    taken = client.put(URL, json=body(every_seconds=60), headers=create_only)
    assert "exists" in assert_problem(taken, 412, "PRECONDITION_FAILED")["detail"]
    got = client.get(URL, headers=admin).json()
    assert (got["version"], got["every_seconds"]) == (1, 3600)
    # Tags: refused only when one of them is current.
    current = client.get(URL, headers=admin).headers["ETag"]
    assert_problem(client.put(URL, json=body(every_seconds=60), headers={
        **admin, "If-None-Match": current}), 412, "PRECONDITION_FAILED")  # fmt: skip
    weak = {**admin, "If-None-Match": "W/" + current}  # If-None-Match compares weakly
    assert_problem(client.put(URL, json=body(every_seconds=60), headers=weak), 412,
                   "PRECONDITION_FAILED")  # fmt: skip
    other = {**admin, "If-None-Match": '"elsewhere.1"'}
    assert client.put(URL, json=body(every_seconds=60), headers=other).status_code == 200


def test_next_fires_start_at_start_at_ms_and_show_the_local_offset(
    client: Client, admin: dict[str, str], task: str
) -> None:
    start = 1_900_000_000_000
    r = client.put(
        URL, json=body(start_at_ms=start, timezone="Asia/Shanghai", paused=True), headers=admin
    )
    assert r.status_code == 201, r.text
    first = r.json()["next_fires"][0]
    assert first["at_ms"] == start + 3600_000 - start % 3600_000
    assert first["local"].endswith("+08:00")


def test_bad_definitions_are_refused_with_their_codes(
    client: Client, admin: dict[str, str], task: str
) -> None:
    assert_problem(client.put(URL, json={"task": "hello"}, headers=admin), 422, "INVALID_SCHEDULE")
    both = body(cron=["* * * * *"])
    assert_problem(client.put(URL, json=both, headers=admin), 422, "INVALID_SCHEDULE")
    zero = body(every_seconds=0)
    assert_problem(client.put(URL, json=zero, headers=admin), 422, "INVALID_SCHEDULE")
    huge = body(every_seconds=None, cron=["*/1000 * * * *"])
    problem = assert_problem(client.put(URL, json=huge, headers=admin), 422, "INVALID_SCHEDULE")
    assert problem["detail"].startswith("cron[0]: a minute step must be 1 to 59"), problem
    zone = body(timezone="Mars/Olympus")
    assert_problem(client.put(URL, json=zone, headers=admin), 422, "INVALID_TIMEZONE")
    nobody = body(task="nobody")
    assert_problem(client.put(URL, json=nobody, headers=admin), 404, "TASK_NOT_FOUND")
    unknown = body(overlap="sometimes")
    assert_problem(client.put(URL, json=unknown, headers=admin), 422, "VALIDATION_FAILED")
    for path in ("", "/pause", "/resume", "/decisions"):
        method = "POST" if path in ("/pause", "/resume") else "GET"
        missing = client.request(method, URL + path, headers=admin)
        assert_problem(missing, 404, "SCHEDULE_NOT_FOUND")
    assert_problem(client.delete(URL, headers=admin), 404, "SCHEDULE_NOT_FOUND")


def test_writes_need_definitions_write_and_reads_definitions_read(
    client: Client, make_token: MakeToken, admin: dict[str, str], task: str
) -> None:
    reader = {"Authorization": f"Bearer {make_token('definitions:read')}"}
    assert_problem(client.put(URL, json=body(), headers=reader), 403, "FORBIDDEN")
    assert client.put(URL, json=body(), headers=admin).status_code == 201
    assert client.get(URL, headers=reader).status_code == 200
    assert_problem(client.post(URL + "/pause", headers=reader), 403, "FORBIDDEN")
    assert_problem(client.delete(URL, headers=reader), 403, "FORBIDDEN")


def test_list_pages_by_name(client: Client, admin: dict[str, str], task: str) -> None:
    for name in ("c", "a", "b"):
        assert (
            client.put(f"/api/v1/schedules/{name}", json=body(), headers=admin).status_code == 201
        )
    first = client.get("/api/v1/schedules?limit=2", headers=admin).json()
    assert [s["name"] for s in first["items"]] == ["a", "b"]
    rest = client.get(f"/api/v1/schedules?limit=2&cursor={first['next_cursor']}", headers=admin)
    assert [s["name"] for s in rest.json()["items"]] == ["c"]
    assert rest.json()["next_cursor"] is None


def test_an_every_second_schedule_fires_runs_with_their_trigger_then_pause_and_delete(
    client: Client, admin: dict[str, str], task: str
) -> None:
    assert client.put(URL, json=body(every_seconds=1, overlap="allow", max_concurrent=50),
                      headers=admin).status_code == 201  # fmt: skip
    deadline = time.monotonic() + 5
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline and len(runs) < 2:
        time.sleep(0.2)
        runs = client.get("/api/v1/runs", headers=admin).json()["items"]
    assert len(runs) >= 2
    trigger = runs[0]["trigger"]
    assert (trigger["kind"], trigger["schedule"]) == ("schedule", "nightly")
    assert trigger["slot_ms"] % 1000 == 0
    # Each run exists within a second of its slot (the loop sleeps until the earliest one).
    assert all(r["created_at_ms"] - r["trigger"]["slot_ms"] < 1000 for r in runs)
    decisions = client.get(URL + "/decisions", headers=admin).json()["items"]
    assert decisions[0]["decision"] == "fired"
    assert {d["run"] for d in decisions if d["decision"] == "fired"} >= {r["id"] for r in runs}
    paused = client.post(URL + "/pause", headers=admin)
    assert (paused.status_code, paused.json()["paused"]) == (200, True)
    time.sleep(0.1)
    count = len(client.get("/api/v1/runs", headers=admin).json()["items"])
    time.sleep(1.5)
    assert len(client.get("/api/v1/runs", headers=admin).json()["items"]) == count
    assert client.delete(URL, headers=admin).status_code == 204
    statuses = {r["status"] for r in client.get("/api/v1/runs", headers=admin).json()["items"]}
    assert statuses == {"cancelled"}  # no worker here: every queued run is cancelled
    manual = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin).json()
    assert manual["trigger"] == {
        "kind": "manual",
        "schedule": None,
        "slot_ms": None,
        "rerun_of": None,
    }


def test_a_cron_schedule_in_a_dst_zone_lists_its_next_fires_across_the_spring_gap(
    client: Client, admin: dict[str, str], task: str
) -> None:
    # 2027-03-13 00:00 New York (EST, -05:00): 02:30 on 2027-03-14 does not exist; "shift"
    # fires it at 03:00 EDT, the first instant after the gap (docs/schedules-time.md).
    start = 1_804_914_000_000
    spec = {"task": "hello", "cron": ["30 2 * * *"], "timezone": "America/New_York"}
    r = client.put(URL, json={**spec, "start_at_ms": start, "paused": True}, headers=admin)
    assert r.status_code == 201, r.text
    assert [f["local"] for f in r.json()["next_fires"][:3]] == [
        "2027-03-13T02:30:00-05:00", "2027-03-14T03:00:00-04:00", "2027-03-15T02:30:00-04:00"
    ]  # fmt: skip
    bad = client.put(URL, json={**spec, "timezone": "Mars/Olympus"}, headers=admin)
    assert_problem(bad, 422, "INVALID_TIMEZONE")


def test_an_alias_older_builds_do_not_know_is_stored_as_its_older_synonym(
    client: Client, admin: dict[str, str], task: str
) -> None:
    """A rollback target (a build before @midnight and @annually) answers 422 for its whole
    schedules list on a name it does not know (review): stored as @daily and @yearly."""
    aliases = body(cron=["@midnight", " @Annually ", "5 4 * * *"], every_seconds=None)
    put = client.put(URL, json=aliases, headers=admin)
    assert put.status_code == 201, put.text
    assert put.json()["cron"] == ["@daily", "@yearly", "5 4 * * *"]
    older = body(cron=["@daily", "@yearly", "5 4 * * *"], every_seconds=None)
    again = client.put(URL, json=older, headers=admin)
    assert again.status_code == 200 and again.headers["etag"] == put.headers["etag"]


def test_concurrent_creates_of_one_schedule_are_one_201_and_no_500(
    client: Client, admin: dict[str, str], task: str
) -> None:
    # Before: on PostgreSQL each create that lost the race to insert the new name met the
    # unique constraint and answered 500; If-None-Match: * (create only) was meant for it.
    for url, extra in [("/api/v1/schedules/raced", {}),
                       ("/api/v1/schedules/guarded", {"If-None-Match": "*"})]:  # fmt: skip
        answers = at_once(client, [
            ("PUT", url, {"json": body(every_seconds=60 + i), "headers": admin | extra})
            for i in range(16)
        ])  # fmt: skip
        statuses = sorted(a.status_code for a in answers)
        assert statuses.count(201) == 1, [a.text for a in answers if a.status_code >= 500]
        assert set(statuses) <= ({201, 412} if extra else {200, 201}), statuses
        for a in answers:
            if a.status_code == 412:
                assert_problem(a, 412, "PRECONDITION_FAILED")
