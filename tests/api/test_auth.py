"""Every /api/v1 route demands a token, and each checks its one scope (admin implies all)."""

from __future__ import annotations

import re
import time

import pytest
from sqlalchemy import update

from app.api.main import create_app
from app.api.openapi import api_routes, required_scope
from app.domain.ids import now_ms, uuid7
from app.domain.tokens import SCOPES, new_api_token
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.tables import api_tokens
from app.storage.tokens_repo import TokenRepository
from tests.api.conftest import Client, MakeToken, assert_problem

_SAMPLE_PATH_VALUES = {
    "task": "hello",
    "revision": "1",
    "name": "db-password",
    "recipe_id": "localctx:sha256:" + "0" * 64,
    "number": "1",
}


def _protected_routes() -> list[tuple[str, str, str]]:
    """(method, path, scope) of every route under /api/v1, read from the app itself."""
    found = []
    for route in api_routes(create_app().routes):
        if not route.path.startswith("/api/v1"):
            continue
        scope = required_scope(route) or ""
        for method in sorted(route.methods):
            found.append((method, route.path, scope))
    return found


def _url(path: str) -> str:
    values = dict(_SAMPLE_PATH_VALUES, run_id=uuid7())
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)


ROUTES = _protected_routes()


def test_the_walk_found_every_protected_operation() -> None:
    assert len(ROUTES) == 33  # 17, GET /token (any token), the seven schedule operations (docs/api.md §9), rerun, five of retention (§10), archive and unarchive (§4)
    assert all(set(scope.split()) <= SCOPES for _, _, scope in ROUTES), ROUTES
    # Only a token's own facts are open to a token of any scope.
    assert [(m, p) for m, p, scope in ROUTES if not scope] == [("GET", "/api/v1/token")]


@pytest.mark.parametrize(("method", "path", "scope"), ROUTES)
def test_route_without_token_is_refused_with_a_bearer_challenge(
    client: Client, method: str, path: str, scope: str
) -> None:
    response = client.request(method, _url(path))
    assert_problem(response, 401, "UNAUTHENTICATED")
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    # A route that demands several scopes is refused without any one of them.
    [(m, p, one) for m, p, scopes in ROUTES for one in scopes.split()],
)
def test_route_with_a_token_lacking_its_scope_is_forbidden(
    client: Client, make_token: MakeToken, method: str, path: str, scope: str
) -> None:
    others = sorted(SCOPES - {scope, "admin"})
    token = make_token(*others)
    response = client.request(method, _url(path), headers={"Authorization": f"Bearer {token}"})
    body = assert_problem(response, 403, "FORBIDDEN")
    assert f"lacks the {scope} scope" in body["detail"]


def test_what_starts_or_cancels_runs_through_a_schedule_also_needs_runs_write() -> None:
    """A schedule makes runs happen: definitions:write alone must not run code that
    POST /runs would refuse it (security walk-through)."""
    demanded = {(m, p): scope for m, p, scope in ROUTES if p.startswith("/api/v1/schedules")}
    both = "definitions:write runs:write"
    assert demanded[("PUT", "/api/v1/schedules/{name}")] == both
    assert demanded[("POST", "/api/v1/schedules/{name}/resume")] == both
    assert demanded[("DELETE", "/api/v1/schedules/{name}")] == both  # cancels its queued runs
    assert demanded[("POST", "/api/v1/schedules/{name}/pause")] == "definitions:write"


def test_a_schedule_is_put_with_both_scopes_and_refused_with_definitions_write_alone(
    client: Client, make_token: MakeToken, task: str
) -> None:
    body = {"task": task, "every_seconds": 3600}
    alone = {"Authorization": f"Bearer {make_token('definitions:write')}"}
    refused = client.put("/api/v1/schedules/hourly", json=body, headers=alone)
    assert "lacks the runs:write scope" in assert_problem(refused, 403, "FORBIDDEN")["detail"]
    both = {"Authorization": f"Bearer {make_token('definitions:write', 'runs:write')}"}
    assert client.put("/api/v1/schedules/hourly", json=body, headers=both).status_code == 201
    assert client.post("/api/v1/schedules/hourly/pause", headers=alone).status_code == 200
    assert client.delete("/api/v1/schedules/hourly", headers=alone).status_code == 403
    assert client.delete("/api/v1/schedules/hourly", headers=both).status_code == 204


@pytest.mark.parametrize(
    "header",
    [
        "Bearer ql_" + "A" * 43,  # well-formed, unknown
        "Bearer not-a-token",
        "Basic dXNlcjpwYXNz",
        "Bearer",
    ],
)
def test_unknown_or_malformed_credentials_are_unauthenticated(client: Client, header: str) -> None:
    response = client.get("/api/v1/tasks", headers={"Authorization": header})
    assert_problem(response, 401, "UNAUTHENTICATED")


def test_the_exact_scope_is_enough_without_admin(client: Client, make_token: MakeToken) -> None:
    headers = {"Authorization": f"Bearer {make_token('definitions:read')}"}
    assert client.get("/api/v1/tasks", headers=headers).status_code == 200


def test_a_token_past_its_expiry_is_refused_and_listed_expired(
    client: Client, settings: Settings
) -> None:
    engine = make_engine(settings.database_url)
    try:
        repo = TokenRepository(engine)
        token = new_api_token()
        record = repo.create(
            name="ci", scopes=frozenset({"runs:read"}), token=token, expires_in_ms=60_000
        )
        headers = {"Authorization": f"Bearer {token}"}
        assert client.get("/api/v1/runs", headers=headers).status_code == 200
        with engine.begin() as conn:  # a minute later (the api process's clock judges it)
            conn.execute(
                update(api_tokens).where(api_tokens.c.id == record.id)
                .values(expires_at_ms=now_ms() - 1)
            )  # fmt: skip
        deadline = time.monotonic() + 5  # the lookup is cached for a second, as a revocation
        while client.get("/api/v1/runs", headers=headers).status_code == 200:
            assert time.monotonic() < deadline, "the expiry not seen within the cache TTL"
            time.sleep(0.05)
        body = assert_problem(client.get("/api/v1/runs", headers=headers), 401, "UNAUTHENTICATED")
        assert body["detail"] == "the token is unknown, revoked or expired"
        (listed,) = [r for r in repo.list() if r.name == "ci"]
        assert listed.state(now_ms()) == "expired"
    finally:
        engine.dispose()


def test_a_token_of_any_scope_reads_its_own_name_scopes_and_expiry(
    client: Client, settings: Settings
) -> None:
    """What the web UI asks at sign-in to offer only what the token may do."""
    engine = make_engine(settings.database_url)
    try:
        repo = TokenRepository(engine)
        reader, timed = new_api_token(), new_api_token()
        repo.create(name="viewer", scopes=frozenset({"runs:read", "logs:read"}), token=reader)
        record = repo.create(
            name="ci", scopes=frozenset({"metrics:read"}), token=timed, expires_in_ms=60_000
        )
    finally:
        engine.dispose()
    answer = client.get("/api/v1/token", headers={"Authorization": f"Bearer {reader}"})
    assert answer.status_code == 200
    assert answer.json() == {
        "name": "viewer", "scopes": ["logs:read", "runs:read"], "expires_at_ms": None
    }
    # A scope no route under /api/v1 would take still reads itself; the expiry is the stored one.
    mine = client.get("/api/v1/token", headers={"Authorization": f"Bearer {timed}"}).json()
    assert mine == {"name": "ci", "scopes": ["metrics:read"], "expires_at_ms": record.expires_at_ms}
    assert isinstance(record.expires_at_ms, int)
    head = client.request("HEAD", "/api/v1/token", headers={"Authorization": f"Bearer {reader}"})
    assert head.status_code == 200 and head.content == b""


def test_health_and_readiness_need_no_token(client: Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["database"] == "ok"


def test_a_revoked_token_is_refused_within_the_cache_ttl(
    client: Client, make_token: MakeToken, settings: Settings
) -> None:
    token = make_token("runs:read")
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/runs", headers=headers).status_code == 200
    engine = make_engine(settings.database_url)
    try:
        repo = TokenRepository(engine)
        (name,) = [r.name for r in repo.list() if r.scopes == {"runs:read"}]
        repo.revoke(name)  # as `qinglong token revoke` does, from outside the api process
    finally:
        engine.dispose()
    deadline = time.monotonic() + 5
    while client.get("/api/v1/runs", headers=headers).status_code == 200:
        assert time.monotonic() < deadline, "revocation not seen within the cache TTL"
        time.sleep(0.05)
    assert_problem(client.get("/api/v1/runs", headers=headers), 401, "UNAUTHENTICATED")


def test_two_authorization_headers_are_refused_whichever_comes_first(
    client: Client, admin: dict[str, str]
) -> None:
    # A proxy may read the last where the service read the first: neither is picked.
    unknown = "Bearer ql_" + "A" * 43
    for pair in ([admin["Authorization"], unknown], [unknown, admin["Authorization"]]):
        headers = [("Authorization", value) for value in pair]
        response = client.get("/api/v1/tasks", headers=headers)
        problem = assert_problem(response, 401, "UNAUTHENTICATED")
        assert problem["detail"] == "send one Authorization header, not several"
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/api/v1/tasks", headers=admin).status_code == 200


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Content-Type", "application/json"),
        ("Idempotency-Key", "k-1"),
        ("Range", "bytes=0-1"),
        ("Last-Event-ID", "0"),
    ],
)
def test_a_header_read_as_one_value_sent_twice_is_refused_not_one_picked(
    client: Client, admin: dict[str, str], name: str, value: str
) -> None:
    # The guard read the last Content-Type where the route read the first; of two
    # Idempotency-Keys one was silently picked. A proxy may pick the other.
    headers = [*admin.items(), (name, value), (name, value)]
    response = client.post("/api/v1/runs", json={"task": "nothing-made"}, headers=headers)
    problem = assert_problem(response, 400, "MALFORMED_REQUEST")
    assert problem["detail"] == f"send one {name.title()} header, not several"
    assert client.get("/api/v1/runs", headers=admin).json()["items"] == []
