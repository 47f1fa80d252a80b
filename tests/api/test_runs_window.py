"""``GET /api/v1/runs`` by a window of created time and by schedule (docs/api.md §6).

A scheduled run is made through the schedule's real fire, at a past instant (as
tests/storage/test_schedules.py does): its created time is that instant and its id is made
now, later, as ids made after the clock stepped back are. The window goes by the created
time, so the id's time never puts such a run on the wrong side of ``until``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from app.domain.ids import now_ms
from app.domain.model import ScheduleDefinition
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.schedules_repo import ScheduleRepository
from tests.api.conftest import Client, assert_problem

T0 = 1_699_999_200_000  # in the past: a future fire would move this process's id clock


def _iso(ms: int, offset_hours: int = 0) -> str:
    """An RFC 3339 instant of ``ms`` with the given offset."""
    zone = UTC if offset_hours == 0 else timezone(timedelta(hours=offset_hours))
    return datetime.fromtimestamp(ms / 1000, tz=zone).isoformat(timespec="milliseconds")


def fire_three_slots(settings: Settings) -> None:
    """Schedule ``nightly`` of task hello fires its slots T0+1 s, +2 s, +3 s."""
    engine = make_engine(settings.database_url)
    try:
        repo = ScheduleRepository(engine)
        every = ScheduleDefinition(
            task="hello", revision=None, cron=None, every_seconds=1,
            overlap="allow", max_concurrent=10,
        )  # type: ignore[call-arg]  # fmt: skip
        repo.put_schedule(name="nightly", definition=every, paused=False, at_ms=T0)
        for second in (1, 2, 3):
            assert repo.fire_due(T0 + second * 1000).runs_created == 1
    finally:
        engine.dispose()


def _ids(client: Client, admin: dict[str, str], **params: Any) -> list[str]:
    response = client.get("/api/v1/runs", params=params, headers=admin)
    assert response.status_code == 200, response.text
    return [r["id"] for r in response.json()["items"]]


def _walk(client: Client, admin: dict[str, str], url: str) -> list[str]:
    """Every page from ``url`` on, by the Link header."""
    seen: list[str] = []
    next_url: str | None = url
    while next_url is not None:
        response = client.get(next_url, headers=admin)
        assert response.status_code == 200, response.text
        seen += [r["id"] for r in response.json()["items"]]
        link = response.headers.get("link")
        next_url = link[1 : link.index(">")] if link else None
    return seen


def test_runs_are_listed_by_a_window_of_created_time_and_by_schedule(
    client: Client, admin: dict[str, str], task: str, settings: Settings
) -> None:
    fire_three_slots(settings)
    s3, s2, s1 = _ids(client, admin, schedule="nightly")
    made = []
    for _ in range(2):  # two manual runs, each in its own millisecond
        if made:
            while now_ms() <= made[-1]["created_at_ms"]:
                pass
        made.append(client.post("/api/v1/runs", json={"task": task}, headers=admin).json())
    m1, m2 = made
    scheduled = client.get("/api/v1/runs", params={"schedule": "nightly"}, headers=admin).json()
    assert [(r["trigger"]["schedule"], r["created_at_ms"]) for r in scheduled["items"]] == [
        ("nightly", T0 + 3000), ("nightly", T0 + 2000), ("nightly", T0 + 1000)
    ]  # fmt: skip

    # since holds its instant, until does not; the id's later time does not matter.
    assert _ids(client, admin, schedule="nightly", since=_iso(T0 + 2000)) == [s3, s2]
    assert _ids(client, admin, schedule="nightly", until=_iso(T0 + 2000)) == [s1]
    assert _ids(client, admin, since=_iso(T0 + 1000), until=_iso(T0 + 3000)) == [s2, s1]
    assert _ids(client, admin, until=_iso(T0 + 3001)) == [s3, s2, s1]
    # RFC 3339 puts no bound on a fraction's digits: cut to the millisecond, 10 are taken.
    tenth = _iso(T0 + 2000).replace(".000+", ".0009999999+")
    assert _ids(client, admin, schedule="nightly", since=tenth) == [s3, s2]
    assert _ids(client, admin, since=_iso(m2["created_at_ms"])) == [m2["id"]]
    assert _ids(client, admin, since=_iso(m2["created_at_ms"], 8)) == [m2["id"]]
    assert _ids(client, admin, since=_iso(m1["created_at_ms"], -5)) == [m2["id"], m1["id"]]
    assert _ids(client, admin, until=_iso(m2["created_at_ms"])) == [m1["id"], s3, s2, s1]
    assert _ids(client, admin, task=task, status="queued", schedule="nightly",
                since=_iso(T0), until=_iso(m1["created_at_ms"])) == [s3, s2, s1]  # fmt: skip
    assert _ids(client, admin, schedule="weekly") == []
    assert _ids(client, admin, schedule="nightly", task="other") == []

    # Keyset pages under the filters; a cursor is a position, so one made under other
    # filters (here none) goes on below its run with the new ones.
    window = f"since={_iso(T0)}&until={_iso(m2['created_at_ms'])}".replace("+", "%2B")
    assert _walk(client, admin, f"/api/v1/runs?limit=1&{window}") == [m1["id"], s3, s2, s1]
    first = client.get("/api/v1/runs", params={"limit": 2}, headers=admin).json()
    assert [r["id"] for r in first["items"]] == [m2["id"], m1["id"]]
    after = client.get(
        "/api/v1/runs", params={"cursor": first["next_cursor"], "schedule": "nightly",
                                "until": _iso(T0 + 3000)}, headers=admin,
    ).json()  # fmt: skip
    assert [r["id"] for r in after["items"]] == [s2, s1]


def test_a_bad_window_or_schedule_is_a_clear_422(client: Client, admin: dict[str, str]) -> None:
    for params in (
        {"since": "2026-12-07"},  # a date alone
        {"since": "2026-12-07T03:00:00"},  # no offset
        {"until": "2026-12-07 03:00:00Z"},  # a space
        {"until": "2h"},  # the CLI's forms are the CLI's
        {"since": "2026-02-30T03:00:00Z"},  # no such day
        {"since": "2026-12-07T03:00:00+24:00"},
        {"since": "2026-12-07T03:00:00-00:60"},  # an offset's minute ends at 59
    ):
        body = assert_problem(
            client.get("/api/v1/runs", params=params, headers=admin), 422, "VALIDATION_FAILED"
        )
        (field,) = params
        assert body["detail"] == (
            f"{field} must be an RFC 3339 instant with an offset, such as "
            "2026-12-07T03:00:00+08:00"
        ), body
    for since, until in (("2026-12-07T03:00:00Z", "2026-12-07T02:00:00Z"),
                         ("2026-12-07T03:00:00Z", "2026-12-07T11:00:00+08:00")):  # fmt: skip
        body = assert_problem(
            client.get("/api/v1/runs", params={"since": since, "until": until}, headers=admin),
            422, "VALIDATION_FAILED",
        )  # fmt: skip
        assert body["detail"].startswith("since must be before until"), body
    # curl -G --data "since=...+08:00" sends the + as is, and a query reads it as a space.
    body = assert_problem(
        client.get("/api/v1/runs?since=2026-12-07T03:00:00+08:00", headers=admin),
        422, "VALIDATION_FAILED",
    )  # fmt: skip
    assert body["detail"].endswith("(a + in a URL's query reads as a space: write it %2B)")
    assert_problem(
        client.get("/api/v1/runs", params={"since": "2" * 65}, headers=admin),
        422, "VALIDATION_FAILED",
    )  # fmt: skip
    assert_problem(
        client.get("/api/v1/runs", params={"schedule": "Night ly"}, headers=admin),
        422, "INVALID_NAME",
    )  # fmt: skip
    # A parameter twice is refused, as a JSON key twice is: readers differ on which counts.
    for query, name, paths in (
        ("since=2026-12-07T03:00:00Z&since=2026-12-07T04:00:00Z", "since", ("/api/v1/runs",)),
        ("task=a&limit=1&task=b", "task", ("/api/v1/runs",)),
        ("limit=1&cursor=x&limit=2", "limit", ("/api/v1/runs", "/api/v1/schedules")),
    ):
        for path in paths:
            body = assert_problem(
                client.get(f"{path}?{query}", headers=admin), 422, "VALIDATION_FAILED"
            )
            assert body["detail"] == (
                f"the query names {name} more than once; give each parameter once"
            ), body
    # A name the route does not read is ignored, once or twice, as any unknown one is: the
    # ops routes read none, and their answers list no 422 (api-schemas/openapi.json).
    for path in ("/api/v1/runs?x-y=1&x-y=2", "/healthz?a=1&a=2", "/readyz?a=1&a=2"):
        assert client.get(path, headers=admin).status_code in (200, 503), path
