"""Fixtures for API tests: a real app (lifespan, database, data dir) and real tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import anyio.from_thread
import httpx
import pytest
from fastapi import FastAPI

from app.api.main import create_app
from app.domain.profiles import EDGE
from app.domain.tokens import new_api_token
from app.settings import Settings
from app.storage.engine import make_engine
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
    test_client = Client(create_app(settings))
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
