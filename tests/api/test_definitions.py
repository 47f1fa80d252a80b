"""Definitions over HTTP: idempotent and conflicting writes, ETags, lists with Link headers."""

from __future__ import annotations

from dataclasses import replace

from app.api.main import create_app
from app.domain.canonical import content_digest, recipe_id
from app.settings import JobUserSettings, Settings
from tests.api.conftest import Client, assert_problem

REV = {"argv": ["/usr/bin/python3", "job.py"], "cwd": "/srv/jobs", "timeout_seconds": 60}


def test_recipe_is_created_then_found_again_by_its_content(
    client: Client, admin: dict[str, str]
) -> None:
    body = {"env": {"MODE": "fast"}, "secrets": {"DB_PASSWORD": "db-password"}}
    first = client.post("/api/v1/recipes", json=body, headers=admin)
    assert first.status_code == 201
    assert first.json()["id"] == recipe_id(body["env"], body["secrets"])
    again = client.post("/api/v1/recipes", json=body, headers=admin)
    assert again.status_code == 200
    assert again.json() == first.json()


def test_recipe_get_has_a_strong_etag_and_answers_304(
    client: Client, admin: dict[str, str]
) -> None:
    rid = client.post("/api/v1/recipes", json={"env": {"A": "1"}}, headers=admin).json()["id"]
    got = client.get(f"/api/v1/recipes/{rid}", headers=admin)
    etag = got.headers["etag"]
    assert etag == '"' + rid.removeprefix("localctx:") + '"'
    cached = client.get(f"/api/v1/recipes/{rid}", headers=admin | {"If-None-Match": etag})
    assert cached.status_code == 304
    assert cached.content == b""
    other = client.get(f"/api/v1/recipes/{rid}", headers=admin | {"If-None-Match": '"x"'})
    assert other.status_code == 200


def test_recipe_rules_have_their_codes(client: Client, admin: dict[str, str]) -> None:
    cases = [
        ({"env": {"QL3_RUN": "x"}}, "RESERVED_ENV_KEY"),
        ({"env": {"lower": "x"}}, "INVALID_ENV_KEY"),
        ({"env": {"A": "x"}, "secrets": {"A": "name"}}, "DUPLICATE_ENV_KEY"),
        ({"env": {"A": "x\u0000"}}, "INVALID_ENV_VALUE"),
        ({"env": {"A": "x" * 40_000}}, "LIMIT_EXCEEDED"),
    ]
    for body, code in cases:
        assert_problem(client.post("/api/v1/recipes", json=body, headers=admin), 422, code)
    assert_problem(
        client.get("/api/v1/recipes/localctx:sha256:" + "a" * 64, headers=admin),
        404,
        "RECIPE_NOT_FOUND",
    )


def test_revision_put_is_append_only(client: Client, admin: dict[str, str]) -> None:
    url = "/api/v1/tasks/etl/revisions/1"
    created = client.put(url, json=REV, headers=admin)
    assert created.status_code == 201
    body = created.json()
    assert body["task"] == "etl" and body["revision"] == 1
    assert body["digest"] == content_digest(
        {
            "executor": "local_process",
            "argv": REV["argv"],
            "cwd": "/srv/jobs",
            "recipe": None,
            "timeout_seconds": 60,
            "priority": 0,
        }
    )
    same = client.put(url, json=REV, headers=admin)
    assert same.status_code == 200
    assert same.json() == body
    different = client.put(url, json=REV | {"priority": 5}, headers=admin)
    assert_problem(different, 409, "REVISION_CONFLICT")
    assert client.get(url, headers=admin).json() == body


def test_revision_leftovers_default_to_kill_and_keep_is_part_of_the_content(
    client: Client, admin: dict[str, str]
) -> None:
    default = client.put("/api/v1/tasks/etl/revisions/1", json=REV, headers=admin)
    assert default.status_code == 201 and default.json()["leftovers"] == "kill"
    explicit = client.put(
        "/api/v1/tasks/etl/revisions/1", json=REV | {"leftovers": "kill"}, headers=admin
    )
    assert explicit.status_code == 200  # the default spelled out is the same revision
    url = "/api/v1/tasks/etl/revisions/2"
    kept = client.put(url, json=REV | {"leftovers": "keep"}, headers=admin)
    assert kept.status_code == 201
    assert kept.json()["leftovers"] == "keep"
    assert kept.json()["digest"] == content_digest(
        {
            "executor": "local_process",
            "argv": REV["argv"],
            "cwd": "/srv/jobs",
            "recipe": None,
            "timeout_seconds": 60,
            "priority": 0,
            "leftovers": "keep",
        }
    )
    assert client.get(url, headers=admin).json() == kept.json()
    assert_problem(client.put(url, json=REV, headers=admin), 409, "REVISION_CONFLICT")
    for bad in ("maybe", None, 1, ""):
        refused = client.put(
            "/api/v1/tasks/etl/revisions/3", json=REV | {"leftovers": bad}, headers=admin
        )
        assert_problem(refused, 422, "VALIDATION_FAILED")


def test_revision_with_a_missing_recipe_is_unprocessable(
    client: Client, admin: dict[str, str]
) -> None:
    missing = "localctx:sha256:" + "b" * 64
    response = client.put(
        "/api/v1/tasks/etl/revisions/1", json=REV | {"recipe": missing}, headers=admin
    )
    assert_problem(response, 422, "RECIPE_NOT_FOUND")


def test_revision_rules_have_their_codes(client: Client, admin: dict[str, str]) -> None:
    url = "/api/v1/tasks/etl/revisions/1"
    cases = [
        ({"argv": ["relative"]}, "INVALID_ARGV"),
        ({"argv": ["/bin/sh", "script.sh"]}, "INVALID_ARGV"),
        ({"argv": ["/bin/x"] * 65}, "LIMIT_EXCEEDED"),
        ({"argv": ["/bin/x"], "cwd": "relative"}, "INVALID_CWD"),
        ({"argv": ["/bin/x"], "timeout_seconds": 0}, "LIMIT_EXCEEDED"),
        ({"argv": ["/bin/x"], "priority": 101}, "LIMIT_EXCEEDED"),
        ({"argv": []}, "VALIDATION_FAILED"),
        ({"argv": ["/bin/x"], "executor": "docker"}, "VALIDATION_FAILED"),
        ({"argv": ["/bin/x"], "unknown": 1}, "VALIDATION_FAILED"),
        ({"argv": ["/bin/x"], "priority": True}, "VALIDATION_FAILED"),
    ]
    for body, code in cases:
        assert_problem(client.put(url, json=body, headers=admin), 422, code)
    assert_problem(
        client.put("/api/v1/tasks/Bad!/revisions/1", json=REV, headers=admin),
        422,
        "INVALID_NAME",  # as the same name in a body (docs/api.md §2)
    )
    assert_problem(
        client.put("/api/v1/tasks/etl/revisions/0", json=REV, headers=admin),
        422,
        "VALIDATION_FAILED",
    )


def test_revision_get_has_the_quoted_digest_as_etag(client: Client, admin: dict[str, str]) -> None:
    digest = client.put("/api/v1/tasks/etl/revisions/1", json=REV, headers=admin).json()["digest"]
    url = "/api/v1/tasks/etl/revisions/1"
    got = client.get(url, headers=admin)
    assert got.headers["etag"] == f'"{digest}"'
    for header in (f'"{digest}"', f'W/"{digest}"', f'"other", "{digest}"', "*"):
        assert client.get(url, headers=admin | {"If-None-Match": header}).status_code == 304
    # Two header lines are one list (RFC 9110 §5.3): the second line's tag counts too.
    lines = [*admin.items(), ("If-None-Match", '"other"'), ("If-None-Match", f'"{digest}"')]
    assert client.get(url, headers=lines).status_code == 304


def test_missing_tasks_and_revisions_are_404(client: Client, admin: dict[str, str]) -> None:
    assert_problem(client.get("/api/v1/tasks/nope", headers=admin), 404, "TASK_NOT_FOUND")
    assert_problem(client.get("/api/v1/tasks/nope/revisions", headers=admin), 404, "TASK_NOT_FOUND")
    client.put("/api/v1/tasks/etl/revisions/1", json=REV, headers=admin)
    assert_problem(
        client.get("/api/v1/tasks/etl/revisions/9", headers=admin), 404, "REVISION_NOT_FOUND"
    )


def test_task_lists_page_by_keyset_with_a_link_header(
    client: Client, admin: dict[str, str]
) -> None:
    for name in ("a", "b", "c"):
        client.put(f"/api/v1/tasks/{name}/revisions/1", json=REV, headers=admin)
    client.put("/api/v1/tasks/b/revisions/2", json=REV, headers=admin)
    first = client.get("/api/v1/tasks", params={"limit": 2}, headers=admin)
    assert first.json()["items"] == [
        {"task": "a", "latest_revision": 1, "archived": False, "archived_at_ms": None},
        {"task": "b", "latest_revision": 2, "archived": False, "archived_at_ms": None},
    ]
    link = first.headers["link"]
    assert link.endswith('>; rel="next"')
    next_url = link[1 : link.index(">")]
    second = client.get(next_url, headers=admin)
    assert second.json() == {
        "items": [{"task": "c", "latest_revision": 1, "archived": False, "archived_at_ms": None}],
        "next_cursor": None,
    }
    assert "link" not in second.headers
    task = client.get("/api/v1/tasks/b", headers=admin).json()
    assert task["latest_revision"] == 2 and task["latest"]["revision"] == 2
    revisions = client.get("/api/v1/tasks/b/revisions", headers=admin).json()["items"]
    assert [r["revision"] for r in revisions] == [2, 1]


def test_bad_cursors_and_limits_are_422(client: Client, admin: dict[str, str]) -> None:
    assert_problem(
        client.get("/api/v1/tasks", params={"cursor": "garbage"}, headers=admin),
        422,
        "INVALID_CURSOR",
    )
    for limit in (0, 201, "x"):
        assert_problem(
            client.get("/api/v1/tasks", params={"limit": limit}, headers=admin),
            422,
            "VALIDATION_FAILED",
        )


def test_run_as_names_only_an_allowed_job_user_and_leaves_other_digests_unchanged(
    settings: Settings, admin: dict[str, str]
) -> None:
    allowing = replace(settings, job=JobUserSettings(user="nobody", allowed=("ql-batch",)))
    client = Client(create_app(allowing, execution=False))
    try:
        plain = client.put("/api/v1/tasks/etl/revisions/1", json=REV, headers=admin)
        assert plain.status_code == 201 and plain.json()["run_as"] is None
        # Absent run_as: the body (and digest) a revision had before the field existed.
        assert plain.json()["digest"] == content_digest(
            {"executor": "local_process", "argv": REV["argv"], "cwd": "/srv/jobs",
             "recipe": None, "timeout_seconds": 60, "priority": 0}
        )  # fmt: skip
        url = "/api/v1/tasks/etl/revisions/2"
        named = client.put(url, json=REV | {"run_as": "ql-batch"}, headers=admin)
        assert named.status_code == 201 and named.json()["run_as"] == "ql-batch"
        assert named.json()["digest"] != plain.json()["digest"]
        assert client.get(url, headers=admin).json() == named.json()
        # The default job user is not in the allowlist, nor is anyone else: refused, stored
        # nowhere.
        for bad in ("nobody", "root", "QL-BATCH", ""):
            refused = client.put(
                "/api/v1/tasks/etl/revisions/3", json=REV | {"run_as": bad}, headers=admin
            )
            assert_problem(refused, 422, "RUN_AS_NOT_ALLOWED")
        gone = client.get("/api/v1/tasks/etl/revisions/3", headers=admin)
        assert gone.status_code == 404
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["isolation"] == "job_user"
    finally:
        client.close()


def test_without_ql_job_users_every_run_as_is_refused_and_readyz_says_same_user(
    client: Client, admin: dict[str, str]
) -> None:
    refused = client.put(
        "/api/v1/tasks/etl/revisions/1", json=REV | {"run_as": "nobody"}, headers=admin
    )
    assert_problem(refused, 422, "RUN_AS_NOT_ALLOWED")
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["isolation"] == "same_user"
