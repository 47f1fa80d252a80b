"""RetiringClose: a retiring process's responses all carry ``Connection: close``, CORS's own
preflight answers included (it wraps CORS)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.api.asgi import Message, Receive, RetiringClose, Scope, Send


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-type", b"text/plain"), (b"Connection", b"keep-alive")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def _start_headers(retiring: bool) -> list[tuple[bytes, bytes]]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/", "headers": []}
    guard = RetiringClose(_app, retiring=lambda: retiring)
    asyncio.run(guard(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    headers: list[tuple[bytes, bytes]] = sent[0]["headers"]
    return headers


@pytest.mark.parametrize("retiring", [False, True])
def test_connection_close_is_added_only_while_retiring(retiring: bool) -> None:
    headers = _start_headers(retiring)
    connection = [v for k, v in headers if k.lower() == b"connection"]
    assert connection == ([b"close"] if retiring else [b"keep-alive"])
    assert (b"content-type", b"text/plain") in headers
