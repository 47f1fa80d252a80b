"""Run intents over HTTP: enqueue with idempotency, cancel, and the read side."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import update

from app.api.main import create_app
from app.context.facade import AppFacade
from app.domain.ids import uuid7
from app.domain.model import Run
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.tables import runs
from tests.api.conftest import Client, MakeToken, assert_problem, fail_run, make_running

RUN_FIELDS = {
    "id", "task", "revision", "status", "priority", "version", "created_at_ms",
    "started_at_ms", "finished_at_ms", "cancel_requested", "latest_attempt", "trigger",
    "attempts", "next_attempt_at_ms", "pinned", "waiting",
}  # fmt: skip
ATTEMPT_FIELDS = {
    "number", "status", "exit_code", "signal", "error_code", "started_at_ms",
    "finished_at_ms", "log",
}  # fmt: skip
FORBIDDEN_WORDS = ("pid", "handle", "digest", "argv", "env", "token", "boot_id")


def test_enqueue_creates_a_queued_run_with_a_claimed_attempt(
    client: Client, admin: dict[str, str], task: str
) -> None:
    response = client.post("/api/v1/runs", json={"task": task}, headers=admin)
    assert response.status_code == 201
    run = response.json()
    assert set(run) == RUN_FIELDS
    assert set(run["latest_attempt"]) == ATTEMPT_FIELDS
    assert run["status"] == "queued" and run["revision"] == 1
    assert run["latest_attempt"]["status"] == "claimed"
    assert run["latest_attempt"]["log"] == {
        "bytes": 0,
        "truncated": False,
        "dropped_bytes": 0,
        "truncation_reason": None,
        "dropped_at": None,
        "expired": False,
        "expired_at_ms": None,
    }
    assert run["cancel_requested"] is None


def test_idempotency_key_replays_the_first_run_and_refuses_another_body(
    client: Client, admin: dict[str, str], task: str
) -> None:
    headers = admin | {"Idempotency-Key": "order-42"}
    first = client.post("/api/v1/runs", json={"task": task}, headers=headers)
    again = client.post("/api/v1/runs", json={"task": task, "revision": None}, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other = client.post("/api/v1/runs", json={"task": task, "priority": 7}, headers=headers)
    assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    assert len(client.get("/api/v1/runs", headers=admin).json()["items"]) == 1


def test_idempotency_keys_belong_to_one_token(
    client: Client, admin: dict[str, str], make_token: MakeToken, task: str
) -> None:
    other = {"Authorization": f"Bearer {make_token('runs:write')}"}
    a = client.post("/api/v1/runs", json={"task": task}, headers=admin | {"Idempotency-Key": "k"})
    b = client.post("/api/v1/runs", json={"task": task}, headers=other | {"Idempotency-Key": "k"})
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]


def test_enqueue_refusals(client: Client, admin: dict[str, str], task: str) -> None:
    post = lambda body, **h: client.post("/api/v1/runs", json=body, headers=admin | h)  # noqa: E731
    assert_problem(post({"task": "nope"}), 404, "TASK_NOT_FOUND")
    assert_problem(post({"task": task, "revision": 9}), 404, "REVISION_NOT_FOUND")
    assert_problem(post({"task": task, "priority": 500}), 422, "LIMIT_EXCEEDED")
    assert_problem(post({"task": "Bad Name"}), 422, "INVALID_NAME")
    assert_problem(post({}), 422, "VALIDATION_FAILED")
    assert_problem(
        post({"task": task}, **{"Idempotency-Key": "has space"}), 422, "VALIDATION_FAILED"
    )


def test_cancelling_a_queued_run_cancels_it_at_once_and_a_terminal_run_is_409(
    client: Client, admin: dict[str, str], task: str
) -> None:
    run_id = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"]
    cancelled = client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin)
    assert cancelled.status_code == 202
    body = cancelled.json()
    assert body["status"] == "cancelled"
    assert body["cancel_requested"]["reason"] == "user"
    assert body["latest_attempt"]["status"] == "cancelled"
    assert_problem(client.post(f"/api/v1/runs/{run_id}/cancel", headers=admin), 409, "RUN_TERMINAL")
    assert_problem(
        client.post(f"/api/v1/runs/{uuid7()}/cancel", headers=admin), 404, "RUN_NOT_FOUND"
    )
    assert_problem(
        client.post("/api/v1/runs/not-an-id/cancel", headers=admin), 404, "RUN_NOT_FOUND"
    )
    events = client.get(f"/api/v1/runs/{run_id}/events", headers=admin).json()["items"]
    assert [e["type"] for e in events] == [
        "run.queued", "run.cancel_requested", "attempt.cancelled", "run.cancelled",
    ]  # fmt: skip
    assert [e["seq"] for e in events] == [1, 2, 3, 4]


def test_cancel_of_a_running_run_records_the_intent_once(
    client: Client, admin: dict[str, str], task: str, settings: Settings
) -> None:
    run = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()
    make_running(settings, run["id"])
    first = client.post(f"/api/v1/runs/{run['id']}/cancel", headers=admin).json()
    second = client.post(f"/api/v1/runs/{run['id']}/cancel", headers=admin).json()
    assert first["status"] == "running" and first["cancel_requested"]["reason"] == "user"
    assert second["cancel_requested"] == first["cancel_requested"]
    assert second["version"] == first["version"]


def test_a_cancel_reason_this_build_does_not_know_is_answered_not_a_500(
    client: Client, admin: dict[str, str], task: str, settings: Settings
) -> None:
    """A newer build may record a reason (service_stop, or one not named yet); this build,
    rolled back to or beside it on one database, must still answer the run and the list."""
    run = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()
    make_running(settings, run["id"])
    client.post(f"/api/v1/runs/{run['id']}/cancel", headers=admin)
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id == run["id"]).values(cancel_reason="later"))
    finally:
        engine.dispose()
    one = client.get(f"/api/v1/runs/{run['id']}", headers=admin)
    assert one.status_code == 200 and one.json()["cancel_requested"]["reason"] == "later"
    listed = client.get("/api/v1/runs", headers=admin)
    assert listed.status_code == 200
    assert listed.json()["items"][0]["cancel_requested"]["reason"] == "later"


def test_runs_list_filters_and_pages_newest_first(
    client: Client, admin: dict[str, str], task: str
) -> None:
    ids = [
        client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"]
        for _ in range(5)
    ]
    client.post(f"/api/v1/runs/{ids[0]}/cancel", headers=admin)
    seen: list[str] = []
    url: str | None = "/api/v1/runs?limit=2"
    pages = 0
    while url is not None:
        response = client.get(url, headers=admin)
        seen += [r["id"] for r in response.json()["items"]]
        link = response.headers.get("link")
        url = link[1 : link.index(">")] if link else None
        pages += 1
    assert seen == list(reversed(ids)) and pages == 3
    queued = client.get("/api/v1/runs", params={"status": "queued"}, headers=admin).json()
    assert [r["id"] for r in queued["items"]] == list(reversed(ids[1:]))
    by_task = client.get("/api/v1/runs", params={"task": "other"}, headers=admin).json()
    assert by_task["items"] == []
    assert_problem(
        client.get("/api/v1/runs", params={"status": "nope"}, headers=admin),
        422,
        "VALIDATION_FAILED",
    )


def test_run_reads_never_expose_process_or_secret_details(
    client: Client, admin: dict[str, str], task: str, settings: Settings
) -> None:
    run_id = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"]
    make_running(settings, run_id)
    bodies = [
        client.get(f"/api/v1/runs/{run_id}", headers=admin),
        client.get("/api/v1/runs", headers=admin),
        client.get(f"/api/v1/runs/{run_id}/attempts", headers=admin),
        client.get(f"/api/v1/runs/{run_id}/events", headers=admin),
    ]
    for response in bodies:
        assert response.status_code == 200
        keys = _all_keys(response.json())
        assert not [k for k in keys if any(w in k for w in FORBIDDEN_WORDS)], keys
        assert "4242" not in response.text  # the pid we stored
    run = bodies[0].json()
    assert run["status"] == "running" and run["latest_attempt"]["status"] == "running"
    attempts = bodies[2].json()["items"]
    assert [a["number"] for a in attempts] == [1]


def test_run_reads_of_unknown_runs_are_404(
    client: Client, admin: dict[str, str], task: str
) -> None:
    suffixes = ("", "/attempts", "/events", "/attempts/1/log", "/attempts/1/log?follow=true")
    for suffix in suffixes:
        assert_problem(
            client.get(f"/api/v1/runs/{uuid7()}{suffix}", headers=admin), 404, "RUN_NOT_FOUND"
        )
    # A run that exists, without that attempt: the attempt is what is unknown.
    queued = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"]
    for number in (7, 99):
        assert_problem(
            client.get(f"/api/v1/runs/{queued}/attempts/{number}/log", headers=admin),
            404,
            "ATTEMPT_NOT_FOUND",
        )


def _all_keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [k for k in value] + [k2 for v in value.values() for k2 in _all_keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in _all_keys(v)]
    return []


def test_a_queued_run_says_what_holds_it_back(
    client: Client, admin: dict[str, str], settings: Settings
) -> None:
    """A run that stays queued said nothing of why: its task's limit, every active slot
    taken (QL_MAX_RUNNING, 2 on the edge profile) or a schedule's hold. GET of the run says
    which (the facts of every host first); a list never computes it."""
    for name, extra in (("one", {"max_concurrent": 1}), ("free", {})):
        body = {"argv": ["/bin/true"], **extra}
        assert client.put(f"/api/v1/tasks/{name}/revisions/1", json=body, headers=admin).is_success

    def post(task: str) -> str:
        return str(client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"])

    def waiting(run_id: str) -> object:
        return client.get(f"/api/v1/runs/{run_id}", headers=admin).json()["waiting"]

    first, second = post("one"), post("one")
    assert waiting(second) is None  # nothing active: it starts at the next pass
    make_running(settings, first)
    assert waiting(second) == {"reason": "max_concurrent", "limit": 1, "active": 1}
    assert waiting(first) is None  # running: not waiting
    other = post("free")
    make_running(settings, other)  # two active: every slot of the edge profile taken
    third = post("free")
    assert waiting(third) == {"reason": "max_running", "limit": 2, "active": 2}
    # Its task's limit first: true on every host, where QL_MAX_RUNNING counts the answering
    # host's runs when several share the database.
    assert waiting(second) == {"reason": "max_concurrent", "limit": 1, "active": 1}
    listed = client.get("/api/v1/runs", params={"status": "queued"}, headers=admin).json()
    assert [r["waiting"] for r in listed["items"]] == [None, None]
    # A schedule's queue_one run behind an older run of its schedule that has not ended.
    older, held = post("free"), post("free")
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.id.in_([first, other])).values(status="succeeded"))
            conn.execute(update(runs).where(runs.c.id == older).values(schedule_id="s", slot_ms=1000))
            conn.execute(
                update(runs).where(runs.c.id == held)
                .values(schedule_id="s", slot_ms=2000, hold_from_slot_ms=1000)
            )  # fmt: skip
    finally:
        engine.dispose()
    assert waiting(held) == {"reason": "held", "limit": None, "active": None}
    assert waiting(older) is None and waiting(second) is None
    # A run read queued, then dispatched before the reason was read: not waiting for itself.
    stale = client.app.state.facade.get_run(run_id=second)
    make_running(settings, second)
    assert client.app.state.facade.run_waiting(run=stale) is None


def test_a_queued_run_says_it_waits_for_a_worker_that_does_not_answer(
    settings: Settings, client: Client, admin: dict[str, str]
) -> None:
    """No worker (stopped, crashed, restarting): the run stays queued, and said nothing of
    why while the api's own log said "worker unavailable". Its dispatch backs off, and the
    run's ``waiting`` says it waits for the worker."""
    assert client.put("/api/v1/tasks/t/revisions/1", json={"argv": ["/bin/true"]},
                      headers=admin).is_success  # fmt: skip
    served = Client(create_app(settings))  # execution on; no worker listens on its socket
    try:
        run_id = served.post("/api/v1/runs", json={"task": "t"}, headers=admin).json()["id"]
        deadline = time.monotonic() + 20
        while (got := served.get(f"/api/v1/runs/{run_id}", headers=admin).json())["waiting"] is None:
            assert time.monotonic() < deadline, got  # the enqueue's drain tried the worker
            time.sleep(0.05)
        assert got["status"] == "queued"
        assert got["waiting"] == {"reason": "worker", "limit": None, "active": None}
    finally:
        served.close()
    # An api without execution starts nothing and says nothing of a worker.
    assert client.get(f"/api/v1/runs/{run_id}", headers=admin).json()["waiting"] is None


def test_a_retry_waiting_for_its_time_is_answered_from_the_run_alone(
    client: Client, admin: dict[str, str], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its answer is known from the run (``next_attempt_at_ms``, ``waiting`` null): the
    budget reads behind ``waiting`` (a thread hop on PostgreSQL, up to four statements) are
    not made for it; they are once it is due."""
    body = {"argv": ["/bin/true"], "max_concurrent": 1,
            "retry": {"max_attempts": 2, "initial_delay_seconds": 600}}  # fmt: skip
    assert client.put("/api/v1/tasks/later/revisions/1", json=body, headers=admin).is_success
    run_id = client.post("/api/v1/runs", json={"task": "later"}, headers=admin).json()["id"]
    fail_run(settings, run_id, make_running(settings, run_id))
    asked: list[str] = []
    real = AppFacade.run_waiting

    def counting(self: AppFacade, *, run: Run) -> object:
        asked.append(run.id)
        return real(self, run=run)

    monkeypatch.setattr(AppFacade, "run_waiting", counting)  # the facade is a frozen dataclass
    got = client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert got["status"] == "queued" and got["waiting"] is None
    assert got["next_attempt_at_ms"] is not None
    assert asked == []
