"""GET one run's fast path: the route's exact 200 for a cached token, else the route answers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace

import httpx
import pytest
from fastapi import Request

from app.api.auth import get_facade
from app.api.main import create_app
from app.context.facade import AppFacade
from app.domain.ids import uuid7
from app.settings import Settings
from tests.api.conftest import Client, MakeToken, assert_problem, make_running


@pytest.fixture
def route_calls(client: Client) -> Iterator[list[str]]:
    """The paths the FastAPI routes themselves answered, in order.

    Every run route resolves the facade through ``get_facade``; the fast path never does.
    """

    calls: list[str] = []
    client.app.dependency_overrides[get_facade] = _counting(calls)
    try:
        yield calls
    finally:
        client.app.dependency_overrides.clear()


def _counting(calls: list[str]) -> Callable[[Request], Awaitable[AppFacade]]:
    async def counting(request: Request) -> AppFacade:
        calls.append(request.url.path)
        return await get_facade(request)

    return counting


def _cached(client: Client, token: str) -> dict[str, str]:
    # The facade caches what it authenticated for a second; the request follows at once.
    assert client.app.state.facade.authenticate(token) is not None
    return {"Authorization": f"Bearer {token}"}


def _answer(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    return response.status_code, response.headers.multi_items(), response.content


def test_a_cached_token_gets_the_routes_answer_byte_for_byte_without_the_route(
    client: Client,
    admin: dict[str, str],
    task: str,
    settings: Settings,
    make_token: MakeToken,
    route_calls: list[str],
) -> None:
    running = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"]
    make_running(settings, running)  # the attempt's log facts come from a stat
    cancelled = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"]
    client.post(f"/api/v1/runs/{cancelled}/cancel", headers=admin)  # cancel_requested is set
    for run_id in (running, cancelled):
        route_calls.clear()
        url = f"/api/v1/runs/{run_id}"
        fresh = {"Authorization": f"Bearer {make_token('runs:read')}"}
        by_route = client.get(url, headers=fresh)  # not cached yet: the route checks it
        assert route_calls == [url]
        fast = client.get(url, headers=_cached(client, make_token("runs:read")))
        assert route_calls == [url], "the cached token's read went through the route"
        assert by_route.status_code == 200, by_route.text
        assert _answer(fast) == _answer(by_route)


def test_every_other_answer_comes_from_the_route(
    client: Client, task: str, make_token: MakeToken, route_calls: list[str]
) -> None:
    reader = _cached(client, make_token("runs:read"))
    run_id = client.post("/api/v1/runs", json={"task": task}, headers=_cached(
        client, make_token("runs:write"))).json()["id"]  # fmt: skip
    url = f"/api/v1/runs/{run_id}"
    cases = [
        (f"/api/v1/runs/{uuid7()}", reader, 404, "RUN_NOT_FOUND"),
        (url, _cached(client, make_token("logs:read")), 403, "FORBIDDEN"),
        (url, {}, 401, "UNAUTHENTICATED"),
        (url, {"Authorization": "Basic eDp5"}, 401, "UNAUTHENTICATED"),
        (url.upper().replace("/API/V1/RUNS", "/api/v1/runs"), reader, 404, "RUN_NOT_FOUND"),
    ]
    for path, headers, status, code in cases:
        route_calls.clear()
        assert_problem(client.get(path, headers=headers | _refresh(client, headers)), status, code)
        assert route_calls == [path], (path, status)
    route_calls.clear()
    with_query = client.get(url, params={"fields": "id"}, headers=_refresh(client, reader))
    assert with_query.status_code == 200 and with_query.json()["id"] == run_id
    assert route_calls == [url]


def _refresh(client: Client, headers: dict[str, str]) -> dict[str, str]:
    token = headers.get("Authorization", "").removeprefix("Bearer ")
    if token.startswith("ql_"):
        return _cached(client, token)
    return {}


def test_cors_headers_wrap_the_fast_answer_too(settings: Settings, make_token: MakeToken) -> None:
    origin = "http://panel.example"
    client = Client(create_app(replace(settings, cors_origins=(origin,)), execution=False))
    try:
        admin = _cached(client, make_token("admin"))
        client.put("/api/v1/tasks/t/revisions/1", json={"argv": ["/bin/true"]}, headers=admin)
        run_id = client.post("/api/v1/runs", json={"task": "t"}, headers=admin).json()["id"]
        make_running(settings, run_id)  # a queued run's answer is the route's (``waiting``)
        calls: list[str] = []
        client.app.dependency_overrides[get_facade] = _counting(calls)
        answer = client.get(
            f"/api/v1/runs/{run_id}", headers=_cached(client, make_token("runs:read")) | {
                "Origin": origin})  # fmt: skip
        assert answer.status_code == 200 and calls == []
        assert answer.headers["access-control-allow-origin"] == origin
    finally:
        client.close()


def test_an_error_in_the_fast_read_is_a_500_logged_against_the_route_template(
    client: Client,
    task: str,
    make_token: MakeToken,
    route_calls: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_id = client.post(
        "/api/v1/runs", json={"task": task}, headers=_cached(client, make_token("runs:write"))
    ).json()["id"]

    async def down(self: AppFacade, *, run_id: str) -> None:
        raise RuntimeError("the database went away: SELECT ... " + run_id)

    monkeypatch.setattr(AppFacade, "get_run_async", down)
    route_calls.clear()
    with caplog.at_level(logging.ERROR, logger="qinglong.api"):
        answer = client.get(
            f"/api/v1/runs/{run_id}", headers=_cached(client, make_token("runs:read"))
        )
    assert_problem(answer, 500, "INTERNAL_ERROR")
    assert route_calls == []  # the fast path met the error
    assert [r.getMessage() for r in caplog.records] == [
        "unhandled RuntimeError on GET /api/v1/runs/{run_id}"
    ]
    assert run_id not in caplog.text


def test_two_authorization_headers_are_refused_by_the_route_in_either_order(
    client: Client, task: str, make_token: MakeToken, route_calls: list[str]
) -> None:
    good = _cached(client, make_token("runs:read"))["Authorization"]
    writer = _cached(client, make_token("runs:write"))
    run_id = client.post("/api/v1/runs", json={"task": task}, headers=writer).json()["id"]
    url = f"/api/v1/runs/{run_id}"
    for pair in ([good, "Bearer ql_" + "A" * 43], ["Bearer ql_" + "A" * 43, good], [good, good]):
        route_calls.clear()
        _cached(client, good.removeprefix("Bearer "))
        headers = [("Authorization", value) for value in pair]
        problem = assert_problem(client.get(url, headers=headers), 401, "UNAUTHENTICATED")
        assert "one Authorization header" in problem["detail"]
        assert route_calls == [url], "the fast path answered a request with two tokens"
    assert client.get(url, headers={"Authorization": good}).status_code == 200
