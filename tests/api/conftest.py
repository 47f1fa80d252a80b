"""Fixtures for API tests: a real app (lifespan, database, data dir) and real tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx
import pytest
from fastapi import FastAPI

from app.api.main import create_app
from app.domain.errors import ErrorCode
from app.domain.model import ProcessHandle
from app.domain.profiles import EDGE
from app.domain.tokens import new_api_token
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tokens_repo import TokenRepository

MakeToken = Callable[..., str]


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    """Settings rooted at the test's tmp dir (the SQLite variant keeps its file there too)."""
    return Settings(data_dir=tmp_path, database_url=db_url, profile=EDGE)


class Client:
    """A synchronous httpx client over ``httpx.ASGITransport`` that also runs the lifespan.

    (Starlette's TestClient warns about httpx, which ``filterwarnings=error`` turns into a
    failure; this is the same idea in a dozen lines.)
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._stack = ExitStack()
        self.portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())
        self._lifespan = app.router.lifespan_context(app)
        self.portal.call(self._lifespan.__aenter__)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self._client = httpx.AsyncClient(transport=transport, base_url="http://testserver")

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """Send one request through the app."""
        return self.portal.call(partial(self._client.request, method, url, **kwargs))

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def put(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    def close(self) -> None:
        """Run the lifespan's shutdown (closes the context) and stop the portal."""
        try:
            self.portal.call(self._client.aclose)
            self.portal.call(self._lifespan.__aexit__, None, None, None)
        finally:
            self._stack.close()


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    """A client whose app lifespan built (and will close) the real context."""
    # The definitions and run-intent API alone: no worker, so no dispatcher (tests/e2e run both).
    test_client = Client(create_app(settings, execution=False))
    try:
        yield test_client
    finally:
        test_client.close()


@pytest.fixture
def make_token(settings: Settings) -> Iterator[MakeToken]:
    """Create a real token with the given scopes; returns the plaintext."""
    engine = make_engine(settings.database_url)
    counter = iter(range(10_000))

    def make(*scopes: str) -> str:
        token = new_api_token()
        TokenRepository(engine).create(
            name=f"t{next(counter)}", scopes=frozenset(scopes), token=token
        )
        return token

    try:
        yield make
    finally:
        engine.dispose()


@pytest.fixture
def admin(make_token: MakeToken) -> dict[str, str]:
    """Authorization header of an admin token."""
    return {"Authorization": f"Bearer {make_token('admin')}"}


@pytest.fixture
def task(client: Client, admin: dict[str, str]) -> str:
    """A defined task ``hello`` with revision 1."""
    r = client.put(
        "/api/v1/tasks/hello/revisions/1", json={"argv": ["/bin/echo", "hi"]}, headers=admin
    )
    assert r.status_code == 201, r.text
    return "hello"


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is RFC 9457 problem+json with ``status`` and ``code``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert {"type", "title", "status", "detail", "code"} <= set(body)
    return body


def make_running(settings: Settings, run_id: str) -> str:
    """Drive a run to ``running`` through the repository (as the coordinator would)."""
    engine = make_engine(settings.database_url)
    try:
        attempt = RunReader(engine).get_attempt(run_id, 1)
        repo = RunRepository(engine)
        repo.begin_dispatch(
            run_id=run_id,
            attempt_id=attempt.id,
            expected_version=None,
            token_digest="sha256:" + "0" * 64,
            deadline_at_ms=None,
            log_artifact_id="log:" + attempt.id,
        )
        handle = ProcessHandle(
            boot_id="b", pid=4242, pgid=4242, start_ticks=1, shim_pid=4241, shim_start_ticks=1
        )
        repo.record_running(run_id=run_id, attempt_id=attempt.id, handle=handle, started_at_ms=1)
        return attempt.id
    finally:
        engine.dispose()


def fail_run(settings: Settings, run_id: str, attempt_id: str) -> None:
    """End a running attempt as failed (a terminal state) through the repository."""
    engine = make_engine(settings.database_url)
    try:
        RunRepository(engine).fail_attempt(
            run_id=run_id, attempt_id=attempt_id, error_code=ErrorCode.EXECUTOR_START_FAILED
        )
    finally:
        engine.dispose()


def admin_client_with_a_task(
    settings: Settings, *, migrate: bool = False
) -> tuple[Client, dict[str, str]]:
    """An app without execution on ``settings``' database (migrated first if asked), an
    admin token's headers, and task ``hello`` (``/bin/true``) defined; the caller closes the
    client."""
    engine = make_engine(settings.database_url)
    try:
        if migrate:
            upgrade_to_head(engine)
        token = new_api_token()
        TokenRepository(engine).create(name="admin", scopes=frozenset({"admin"}), token=token)
    finally:
        engine.dispose()
    client = Client(create_app(settings, execution=False))
    admin = {"Authorization": f"Bearer {token}"}
    r = client.put("/api/v1/tasks/hello/revisions/1", json={"argv": ["/bin/true"]}, headers=admin)
    if r.status_code != 201:
        client.close()
        raise AssertionError(r.text)
    return client, admin


def at_once(client: Client, requests: list[tuple[str, str, dict[str, Any]]]) -> list[Any]:
    """Send ``requests`` concurrently through the app (each sync route in its own thread)."""

    async def send_all() -> list[Any]:
        out: list[Any] = [None] * len(requests)
        async with anyio.create_task_group() as tg:
            for i, (method, url, kw) in enumerate(requests):

                async def one(i: int = i, method: str = method, url: str = url,
                              kw: dict[str, Any] = kw) -> None:  # fmt: skip
                    out[i] = await client._client.request(method, url, **kw)

                tg.start_soon(one)
        return out

    return client.portal.call(send_all)

