"""A key twice in any JSON object of a body is refused with 422 DUPLICATE_KEY, before any write."""

from __future__ import annotations

import gzip
import zlib

import pytest

from app.api.main import create_app
from app.api.openapi import api_routes
from app.api.strict_json import StrictJSONRoute
from app.settings import Settings
from tests.api.conftest import Client, assert_problem

JSON = {"Content-Type": "application/json"}


def test_a_task_named_twice_is_refused_and_no_run_is_created(
    client: Client, admin: dict[str, str], task: str
) -> None:
    raw = b'{"task":"nope","task":"' + task.encode() + b'"}'
    assert_problem(
        client.post("/api/v1/runs", content=raw, headers=admin | JSON), 422, "DUPLICATE_KEY"
    )
    assert client.get("/api/v1/runs", headers=admin).json()["items"] == []


def test_an_env_key_named_twice_is_refused_and_no_recipe_is_stored(
    client: Client, admin: dict[str, str]
) -> None:
    raw = b'{"env":{"A":"1","A":"2"}}'
    body = assert_problem(
        client.post("/api/v1/recipes", content=raw, headers=admin | JSON), 422, "DUPLICATE_KEY"
    )
    assert "A" not in body["detail"].split()  # the key is not echoed
    # The same recipe without the duplicate is new (201): nothing was stored before.
    ok = client.post("/api/v1/recipes", json={"env": {"A": "2"}}, headers=admin)
    assert ok.status_code == 201, ok.text


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1,"\\u0061":2}',  # equal once unescaped
        b'{"env":{},"secrets":{"S":"x","T":"y","S":"x"}}',  # same value twice is still two keys
        b'{"env":{"A":"1"},"env":{"A":"1"}}',
        b'{"x":[{"k":1},{"k":1,"k":2}]}',  # inside an array, at depth
    ],
)
def test_duplicates_at_any_depth_are_refused(
    client: Client, admin: dict[str, str], raw: bytes
) -> None:
    assert_problem(
        client.post("/api/v1/recipes", content=raw, headers=admin | JSON), 422, "DUPLICATE_KEY"
    )


def test_every_body_route_is_strict(client: Client, admin: dict[str, str], task: str) -> None:
    raw = b'{"argv":["/bin/true"],"argv":["/bin/false"]}'
    assert_problem(
        client.put("/api/v1/tasks/t/revisions/1", content=raw, headers=admin | JSON),
        422,
        "DUPLICATE_KEY",
    )
    raw = b'{"value":"a","value":"b"}'
    assert_problem(
        client.put("/api/v1/secrets/s", content=raw, headers=admin | JSON), 422, "DUPLICATE_KEY"
    )
    # Without a JSON content type the body is not read as JSON at all: 415.
    raw = b'{"task":"nope","task":"' + task.encode() + b'"}'
    assert_problem(
        client.post("/api/v1/runs", content=raw, headers=admin), 415, "UNSUPPORTED_MEDIA_TYPE"
    )
    assert client.get("/api/v1/runs", headers=admin).json()["items"] == []


def test_malformed_json_keeps_its_own_code(client: Client, admin: dict[str, str]) -> None:
    assert_problem(
        client.post("/api/v1/recipes", content=b'{"a":1,', headers=admin | JSON),
        400,
        "MALFORMED_JSON",
    )


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_a_body_in_utf_16_or_32_is_malformed_json_and_no_run_is_created(
    client: Client, admin: dict[str, str], task: str, encoding: str
) -> None:
    # Without a byte order mark, ASCII text in these encodings is valid UTF-8 (NULs between
    # the letters), so the guard's UTF-8 check let it through, and json.loads of bytes
    # guesses the encoding: the run was created. A proxy or WAF that reads the body as the
    # UTF-8 it must be (RFC 8259 §8.1) would have judged other bytes than the service ran.
    raw = ('{"task":"' + task + '"}').encode(encoding)
    assert_problem(
        client.post("/api/v1/runs", content=raw, headers=admin | JSON), 400, "MALFORMED_JSON"
    )
    assert client.get("/api/v1/runs", headers=admin).json()["items"] == []
    # UTF-8 with its byte order mark is still taken (as before).
    bom = b"\xef\xbb\xbf" + ('{"task":"' + task + '"}').encode()
    ok = client.post("/api/v1/runs", content=bom, headers=admin | JSON)
    assert ok.status_code == 201, ok.text


def test_no_route_of_the_app_escapes_the_strict_route_class(settings: Settings) -> None:
    routes = api_routes(create_app(settings, execution=False).routes)
    assert len(routes) > 10
    # The OpenAPI/doc routes are Starlette routes, not APIRoutes; every API route is strict.
    assert all(isinstance(r, StrictJSONRoute) for r in routes), [
        r.path for r in routes if not isinstance(r, StrictJSONRoute)
    ]


def test_a_body_of_another_media_type_is_415_and_nothing_is_written(
    client: Client, admin: dict[str, str], task: str
) -> None:
    raw = b'{"task":"' + task.encode() + b'"}'
    for media in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data", None):
        headers = admin if media is None else admin | {"Content-Type": media}
        problem = assert_problem(
            client.post("/api/v1/runs", content=raw, headers=headers),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        )
        assert "Content-Type: application/json" in problem["detail"]
    put = client.put("/api/v1/secrets/s", content=b'{"value":"v"}',
                     headers=admin | {"Content-Type": "text/plain"})  # fmt: skip
    assert_problem(put, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert client.get("/api/v1/runs", headers=admin).json()["items"] == []
    assert client.get("/api/v1/secrets", headers=admin).json()["items"] == []
    # JSON by any of its names is read as before.
    for media in ("application/json; charset=utf-8", "application/vnd.ql+json"):
        created = client.post("/api/v1/runs", content=raw, headers=admin | {"Content-Type": media})
        assert created.status_code == 201, (media, created.text)
    # Bytes that are not even UTF-8, without a JSON type: the media type is what is wrong.
    odd = client.post("/api/v1/runs", content=b"\xff\xfe", headers=admin)
    assert_problem(odd, 415, "UNSUPPORTED_MEDIA_TYPE")
    # No body at all is the model's business (a required body is missing), not a media type's.
    empty = {"Content-Type": "application/x-www-form-urlencoded"}
    assert_problem(client.post("/api/v1/runs", headers=admin | empty), 422, "VALIDATION_FAILED")


def test_a_write_that_takes_no_body_refuses_one_instead_of_ignoring_it(
    client: Client, admin: dict[str, str], task: str
) -> None:
    run = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()
    # A priority on a rerun would be ignored: refused, and no rerun is made.
    problem = assert_problem(
        client.post(f"/api/v1/runs/{run['id']}/rerun", json={"priority": 9}, headers=admin),
        422,
        "VALIDATION_FAILED",
    )
    assert problem["detail"] == "POST /api/v1/runs/{run_id}/rerun takes no body; send none"
    assert len(client.get("/api/v1/runs", headers=admin).json()["items"]) == 1
    for raw in (b"not json", b'{"reason": "x"}', b"[]", b"[" * 200_000):
        refused = client.post(f"/api/v1/runs/{run['id']}/cancel", content=raw, headers=admin)
        assert_problem(refused, 422, "VALIDATION_FAILED")
    assert client.get(f"/api/v1/runs/{run['id']}", headers=admin).json()["cancel_requested"] is None
    # None, blanks or an empty object (some clients send one by default) are taken.
    for raw in (b"", b" \n", b"{}", b"{ }", b"\xef\xbb\xbf{}"):
        pinned = client.post(f"/api/v1/runs/{run['id']}/pin", content=raw, headers=admin | JSON)
        assert pinned.status_code == 200, (raw, pinned.text)
    assert client.post(f"/api/v1/runs/{run['id']}/cancel", headers=admin).status_code in (200, 202)
    # Reads are untouched.
    assert client.request("GET", "/api/v1/runs", content=b"x", headers=admin).status_code == 200


def test_a_coded_body_is_415_naming_its_coding_and_nothing_is_written(
    client: Client, admin: dict[str, str], task: str
) -> None:
    # Before: the gzip bytes were read as the body itself (400 MALFORMED_JSON here, since
    # they are not UTF-8), and a coded body that happened to parse would have run, where a
    # proxy or WAF that decodes Content-Encoding judged other bytes. No coding is decoded.
    raw = b'{"task":"' + task.encode() + b'"}'
    coded = {"gzip": gzip.compress(raw), "deflate": zlib.compress(raw), "br": raw}
    for coding, body in coded.items():
        headers = admin | JSON | {"Content-Encoding": coding}
        refused = client.post("/api/v1/runs", content=body, headers=headers)
        problem = assert_problem(refused, 415, "UNSUPPORTED_MEDIA_TYPE")
        assert f'Content-Encoding "{coding}" is not accepted' in problem["detail"]
        assert "identity is the only content coding" in problem["detail"]
        assert refused.headers["accept-encoding"] == "identity"
    # Every body route, whatever the header's spelling: a list, two lines, any case.
    put = client.put("/api/v1/secrets/s", content=b'{"value":"v"}',
                     headers=admin | JSON | {"Content-Encoding": "identity, GZIP"})  # fmt: skip
    assert "GZIP" in assert_problem(put, 415, "UNSUPPORTED_MEDIA_TYPE")["detail"]
    lines = [*admin.items(), *JSON.items(), ("Content-Encoding", "identity"),
             ("Content-Encoding", "x-custom")]  # fmt: skip
    two = client.put("/api/v1/tasks/t/revisions/1", content=b'{"argv":["/bin/true"]}',
                     headers=lines)  # fmt: skip
    assert '"x-custom"' in assert_problem(two, 415, "UNSUPPORTED_MEDIA_TYPE")["detail"]
    # What is not a coding's name is not echoed.
    odd = client.post("/api/v1/recipes", content=b"{}",
                      headers=admin | JSON | {"Content-Encoding": "gz{ip}"})  # fmt: skip
    assert "gz" not in assert_problem(odd, 415, "UNSUPPORTED_MEDIA_TYPE")["detail"]
    assert client.get("/api/v1/runs", headers=admin).json()["items"] == []
    assert client.get("/api/v1/secrets", headers=admin).json()["items"] == []
    assert client.get("/api/v1/tasks/t/revisions", headers=admin).status_code == 404
    # identity, in any case, is no coding: read as before; so is a request without a body.
    for same in ("identity", "Identity", " identity , identity", ""):
        headers = admin | JSON | {"Content-Encoding": same}
        created = client.post("/api/v1/runs", content=raw, headers=headers)
        assert created.status_code == 201, (same, created.text)
    plain = client.get("/api/v1/runs", headers=admin | {"Content-Encoding": "gzip"})
    assert plain.status_code == 200, plain.text
