"""Every error is problem+json: routing, malformed and oversize bodies, unexpected failures."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import anyio
import httpx

from app.api.main import create_app
from app.settings import Settings
from tests.api.conftest import Client, assert_problem

MIB = 1024 * 1024


def test_unknown_paths_and_methods(client: Client, admin: dict[str, str]) -> None:
    assert_problem(client.get("/nope"), 404, "NOT_FOUND")
    assert_problem(client.get("/api/v1/nope", headers=admin), 404, "NOT_FOUND")
    assert_problem(client.delete("/api/v1/tasks", headers=admin), 405, "METHOD_NOT_ALLOWED")


def test_a_refused_method_names_every_method_the_path_allows(
    client: Client, admin: dict[str, str]
) -> None:
    # Each path is served by several routes, one method each (RFC 9110 §15.5.6).
    for method, path, allowed in [
        ("DELETE", "/api/v1/runs", "GET, HEAD, POST"),
        ("PATCH", "/api/v1/schedules/x", "DELETE, GET, HEAD, PUT"),
        ("POST", "/api/v1/secrets/x", "DELETE, PUT"),
    ]:
        response = client.request(method, path, headers=admin)
        assert_problem(response, 405, "METHOD_NOT_ALLOWED")
        assert response.headers["allow"] == allowed, (method, path)
    # The UI's static files answer GET (and HEAD) only; never an empty Allow.
    ui = client.post("/ui/index.html")
    assert ui.status_code == 405 and ui.headers["allow"] == "GET, HEAD"


def test_allow_is_found_below_a_root_path(settings: Settings) -> None:
    # Behind a proxy that strips a prefix (uvicorn --root-path), routes match without it.
    app = create_app(settings, execution=False)
    transport = httpx.ASGITransport(app=app, root_path="/q")

    async def refused() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            return await http.delete("/q/api/v1/runs")

    response = anyio.run(refused)
    assert response.status_code == 405 and response.headers["allow"] == "GET, HEAD, POST"


def test_a_trailing_slash_is_an_unknown_path_not_a_redirect(
    client: Client, admin: dict[str, str]
) -> None:
    # A redirect came before authentication, its Location built from the Host header.
    for headers in ({}, admin):
        response = client.get("/api/v1/tasks/", headers={**headers, "Host": "elsewhere.example"})
        assert_problem(response, 404, "NOT_FOUND")
        assert "location" not in response.headers
    assert client.get("/ui").headers["location"] == "/ui/"  # the UI's own redirect stays


def test_malformed_json_is_400(client: Client, admin: dict[str, str]) -> None:
    headers = admin | {"Content-Type": "application/json"}
    for raw in (b"{bad", b'{"env": ', b"[" * 100_000):
        assert_problem(
            client.post("/api/v1/recipes", content=raw, headers=headers), 400, "MALFORMED_JSON"
        )


def test_invalid_utf8_is_400(client: Client, admin: dict[str, str]) -> None:
    headers = admin | {"Content-Type": "application/json"}
    raw = b'{"env": {"A": "\xff\xfe"}}'
    body = assert_problem(
        client.post("/api/v1/recipes", content=raw, headers=headers), 400, "MALFORMED_JSON"
    )
    assert "UTF-8" in body["detail"]


def test_lone_surrogates_are_refused_not_crashed_on(client: Client, admin: dict[str, str]) -> None:
    headers = admin | {"Content-Type": "application/json"}
    raw = b'{"value": "\\ud800"}'
    assert_problem(
        client.put("/api/v1/secrets/x", content=raw, headers=headers), 422, "VALIDATION_FAILED"
    )


def test_one_string_where_a_list_is_due_is_told_the_form(
    client: Client, admin: dict[str, str]
) -> None:
    for url, body, field in (
        ("/api/v1/schedules/nightly", {"task": "t", "cron": "0 3 * * *"}, "cron"),
        ("/api/v1/tasks/t/revisions/1", {"argv": "/bin/true"}, "argv"),
    ):
        answer = assert_problem(client.put(url, json=body, headers=admin), 422, "VALIDATION_FAILED")
        assert answer["detail"] == f'{field}: must be a JSON list, even of one item: ["..."]'


def test_body_over_the_limit_is_refused_from_content_length(
    client: Client, admin: dict[str, str]
) -> None:
    raw = b'{"env": {"A": "' + b"x" * MIB + b'"}}'
    response = client.post(
        "/api/v1/recipes", content=raw, headers=admin | {"Content-Type": "application/json"}
    )
    assert_problem(response, 413, "PAYLOAD_TOO_LARGE")


def test_chunked_body_over_the_limit_is_refused_before_it_ends(
    client: Client, admin: dict[str, str]
) -> None:
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        for _ in range(64):  # 4 MiB offered in 64 KiB pieces
            sent += 1
            yield b"x" * (64 * 1024)

    async def agen():  # type: ignore[no-untyped-def]
        for chunk in chunks():
            yield chunk

    response = client.post(
        "/api/v1/recipes", content=agen(), headers=admin | {"Content-Type": "application/json"}
    )
    assert_problem(response, 413, "PAYLOAD_TOO_LARGE")
    assert sent <= 17  # 1 MiB + one piece read, never the whole body


def test_a_transfer_coding_other_than_chunked_is_refused_and_nothing_is_written(
    client: Client, admin: dict[str, str]
) -> None:
    # Before: uvicorn's default parser (httptools) took "gzip, chunked" as chunked and the
    # guard read the de-chunked bytes as the body itself, where h11 refused the request and a
    # proxy that decodes the transfer coding judged other bytes (as for Content-Encoding).
    async def body():  # type: ignore[no-untyped-def]
        yield b'{"argv": ["/bin/true"]}'

    json_type = {"Content-Type": "application/json"}
    for coding in ("gzip, chunked", "x-custom,chunked", "identity, chunked", "gzip"):
        headers = admin | json_type | {"Transfer-Encoding": coding}
        refused = client.put("/api/v1/tasks/t/revisions/1", content=body(), headers=headers)
        problem = assert_problem(refused, 400, "MALFORMED_REQUEST")
        assert "chunked" in problem["detail"]
        assert refused.headers["connection"] == "close"
    # Two lines are one list: gzip on one, chunked on the other, is gzip then chunked.
    lines = [*admin.items(), *json_type.items(), ("Transfer-Encoding", "gzip"),
             ("Transfer-Encoding", "chunked")]  # fmt: skip
    two = client.put("/api/v1/tasks/t/revisions/1", content=body(), headers=lines)
    assert_problem(two, 400, "MALFORMED_REQUEST")
    assert client.get("/api/v1/tasks/t/revisions", headers=admin).status_code == 404
    # chunked alone, in any case, is the body's framing: read as before.
    for same in ("chunked", "Chunked", " chunked "):
        headers = admin | json_type | {"Transfer-Encoding": same}
        put = client.put("/api/v1/tasks/t/revisions/1", content=body(), headers=headers)
        assert put.status_code in (200, 201), (same, put.text)


def test_a_body_at_the_limit_is_accepted(client: Client, admin: dict[str, str]) -> None:
    prefix, suffix = b'{"value": "', b'"}'
    raw = prefix + b"v" * (MIB - len(prefix) - len(suffix)) + suffix
    assert len(raw) == MIB
    response = client.put(
        "/api/v1/secrets/big", content=raw, headers=admin | {"Content-Type": "application/json"}
    )
    # Reaches validation (a secret value is at most 32 KiB): not refused as too large.
    assert_problem(response, 422, "LIMIT_EXCEEDED")


def test_unexpected_failures_are_500_problems_without_internals(settings: Settings) -> None:
    app = create_app(settings)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret-internal-detail")

    test_client = Client(app)
    try:
        response = test_client.get("/boom")
    finally:
        test_client.close()
    body = assert_problem(response, 500, "INTERNAL_ERROR")
    assert "secret-internal-detail" not in response.text
    assert body["detail"] == "an internal error occurred"


def test_a_name_in_the_path_that_breaks_the_rule_is_invalid_name_as_in_a_body(
    client: Client, admin: dict[str, str]
) -> None:
    for method, path, name, body in [
        ("GET", "/api/v1/tasks/{}/revisions", "Bad-Name", None),
        ("PUT", "/api/v1/secrets/{}", "UPPER", {"value": "v"}),
        ("GET", "/api/v1/schedules/{}", "-dash-first", None),
        ("GET", "/api/v1/runs?task={}", "Bad.Name", None),
    ]:
        response = client.request(method, path.format(name), json=body, headers=admin)
        problem = assert_problem(response, 422, "INVALID_NAME")
        assert "must match [a-z0-9]" in problem["detail"]
        assert name not in problem["detail"]  # the input is not echoed


# The first five pydantic's lax int parsing read as numbers (a float, Python's digit
# separator, a sign, spaces); the rest it refused already, with another message.
NOT_PLAIN_DIGITS = ("5.0", "1_0", "+5", " 5", "5 ", "1e1", "0x10", "", "\u0665")


def test_an_integer_query_parameter_takes_plain_decimal_digits_only(
    client: Client, admin: dict[str, str]
) -> None:
    for path in (
        "/api/v1/runs",
        "/api/v1/tasks",
        "/api/v1/secrets",
        "/api/v1/schedules",
        "/api/v1/runs/r/events",
        "/api/v1/tasks/t/revisions",
        "/api/v1/schedules/s/decisions",
    ):
        for spelling in NOT_PLAIN_DIGITS:
            response = client.get(path, params={"limit": spelling}, headers=admin)
            body = assert_problem(response, 422, "VALIDATION_FAILED")
            assert body["detail"].startswith("query.limit: "), (path, spelling, body)
            assert "plain decimal digits" in body["detail"], (path, spelling, body)
        # The bounds still say theirs; leading zeros are plain digits.
        body = assert_problem(
            client.get(path, params={"limit": "201"}, headers=admin), 422, "VALIDATION_FAILED"
        )
        assert body["detail"] == "query.limit: Input should be less than or equal to 200"
    assert client.get("/api/v1/runs", params={"limit": "05"}, headers=admin).status_code == 200
    # A number too long for any bound is refused by the bound, never a 500.
    huge = client.get("/api/v1/runs", params={"limit": "9" * 5000}, headers=admin)
    assert_problem(huge, 422, "VALIDATION_FAILED")


def test_an_integer_in_the_path_takes_plain_decimal_digits_only(
    client: Client, admin: dict[str, str], task: str
) -> None:
    """`/revisions/1.0` was read as revision 1, `/attempts/1_0/log` as attempt 10."""
    run = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"]
    for template, name in (
        (f"/api/v1/tasks/{task}/revisions/{{}}", "revision"),
        (f"/api/v1/runs/{run}/attempts/{{}}/log", "number"),
    ):
        for spelling in ("1.0", "1_0", "+1", "1e0", "\u0661"):
            response = client.get(template.format(quote(spelling)), headers=admin)
            body = assert_problem(response, 422, "VALIDATION_FAILED")
            assert body["detail"].startswith(f"path.{name}: "), (template, spelling, body)
    assert client.get(f"/api/v1/tasks/{task}/revisions/1", headers=admin).status_code == 200
