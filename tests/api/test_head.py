"""HEAD is answered wherever GET is, with GET's status and headers and no body (app/api/head.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from app.api.head import HeadAsGet
from app.settings import Settings
from tests.api.conftest import Client, assert_problem
from tests.api.test_logs import _run_with_log, _url

_SAME = ("content-type", "content-length", "etag", "cache-control", "x-content-type-options")


def _same_head(client: Client, path: str, headers: dict[str, str]) -> httpx.Response:
    got = client.get(path, headers=headers)
    head = client.request("HEAD", path, headers=headers)
    assert head.status_code == got.status_code, path
    assert head.content == b"", path
    for name in _SAME:
        assert head.headers.get(name) == got.headers.get(name), (path, name)
    return head


def test_head_answers_as_get_without_the_body(
    client: Client, admin: dict[str, str], task: str
) -> None:
    run_id = client.post("/api/v1/runs", json={"task": task}, headers=admin).json()["id"]
    for path in ("/healthz", f"/api/v1/runs/{run_id}", "/api/v1/tasks", "/ui/"):
        head = _same_head(client, path, admin)
        assert head.status_code == 200 and int(head.headers["content-length"]) > 0, path
    # Refusals come as they do for GET: the status and the problem's headers.
    refused = client.request("HEAD", f"/api/v1/runs/{run_id}")
    assert refused.status_code == 401 and refused.content == b""
    assert refused.headers["www-authenticate"] == "Bearer"
    # A path without GET still refuses HEAD, and says what it allows.
    cancel = client.request("HEAD", f"/api/v1/runs/{run_id}/cancel", headers=admin)
    assert cancel.status_code == 405 and cancel.headers["allow"] == "POST"
    assert_problem(client.get(f"/api/v1/runs/{run_id}/cancel", headers=admin), 405,
                   "METHOD_NOT_ALLOWED")  # fmt: skip


def test_head_of_a_log_follow_ends_at_its_headers(
    client: Client,
    admin: dict[str, str],
    settings: Settings,
    task: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert task == "hello"  # the task _run_with_log runs
    run_id, _, _ = _run_with_log(client, admin, settings, b"line\n")
    _same_head(client, _url(run_id), admin)  # the plain log: its length, no bytes
    answers: list[httpx.Response] = []
    # A follow of a running attempt never ends by itself; its HEAD must, even one with
    # nothing to send before a heartbeat an hour away (tail_bytes=0: no line yet).
    client.app.state.log_heartbeat_s = 3600
    follow = threading.Thread(
        target=lambda: answers.append(client.request(
            "HEAD", _url(run_id), params={"follow": "true", "tail_bytes": 0}, headers=admin
        )),
        daemon=True,
    )  # fmt: skip
    follow.start()
    follow.join(20)
    assert not follow.is_alive(), "HEAD of a follow kept streaming"
    assert answers[0].status_code == 200 and answers[0].content == b""
    assert answers[0].headers["content-type"].startswith("text/event-stream")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a stop, no error


@pytest.mark.parametrize("first_chunk_after_s", [0.0, 3600.0])
def test_head_stops_an_endless_stream_even_where_nothing_listens_for_a_disconnect(
    first_chunk_after_s: float,
) -> None:
    # ASGI spec 2.4: Starlette's StreamingResponse no longer watches for the client leaving,
    # and this receive never answers; only the layer's own stop can end the HEAD, of a
    # stream that talks at once or of one that stays quiet.
    async def endless() -> AsyncIterator[bytes]:
        await anyio.sleep(first_chunk_after_s)
        while True:
            yield b"data: x\n\n"
            await anyio.sleep(0.01)

    async def stream(_request: Request) -> StreamingResponse:
        return StreamingResponse(endless(), media_type="text/event-stream")

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await anyio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
        "method": "HEAD", "scheme": "http", "path": "/s", "raw_path": b"/s", "query_string": b"",
        "root_path": "", "headers": [], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip

    async def main() -> None:
        with anyio.fail_after(10):
            await HeadAsGet(Starlette(routes=[Route("/s", stream)]))(scope, receive, send)

    anyio.run(main)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200 and sent[1] == {
        "type": "http.response.body", "body": b"", "more_body": False
    }
