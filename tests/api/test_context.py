"""The composition root: dispatcher hooks never block or break a route; readiness is pluggable."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from app.api.main import create_app
from app.context.bootstrap import build_context
from app.domain.profiles import EDGE
from app.settings import Settings
from app.storage.engine import make_engine
from tests.api.conftest import Client, assert_problem


def test_after_enqueue_runs_in_the_background_after_the_commit(
    settings: Settings, admin: dict[str, str]
) -> None:
    seen: list[int] = []
    called = threading.Event()
    engine = make_engine(settings.database_url)

    def after_enqueue() -> None:
        # The run is already committed when the hook runs: count it from the database.
        from sqlalchemy import text

        with engine.connect() as conn:
            seen.append(conn.execute(text("SELECT count(*) FROM runs")).scalar_one())
        called.set()

    client = Client(create_app(settings, after_enqueue=after_enqueue, execution=False))
    try:
        client.put("/api/v1/tasks/t/revisions/1", json={"argv": ["/bin/true"]}, headers=admin)
        assert client.post("/api/v1/runs", json={"task": "t"}, headers=admin).status_code == 201
        assert called.wait(10)
    finally:
        client.close()
        engine.dispose()
    assert seen and seen[0] >= 1


def test_a_failing_hook_never_reaches_the_route(settings: Settings, admin: dict[str, str]) -> None:
    calls = threading.Semaphore(0)

    def broken() -> None:
        calls.release()
        raise RuntimeError("dispatcher exploded")

    client = Client(create_app(settings, after_enqueue=broken, execution=False))
    try:
        client.put("/api/v1/tasks/t/revisions/1", json={"argv": ["/bin/true"]}, headers=admin)
        for _ in range(2):
            assert client.post("/api/v1/runs", json={"task": "t"}, headers=admin).status_code == 201
            assert calls.acquire(timeout=10)  # the thread survived the first failure
    finally:
        client.close()


def test_periodic_hook_runs_on_its_interval(settings: Settings) -> None:
    ticks = threading.Semaphore(0)
    context = build_context(settings, periodic=ticks.release, periodic_interval_s=0.01)
    context.start_background()
    try:
        assert ticks.acquire(timeout=10) and ticks.acquire(timeout=10)
    finally:
        context.close()


def _readyz_problem(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """The 503 NOT_READY problem of /readyz on an app built with ``overrides``."""
    client = Client(create_app(settings, **overrides))
    try:
        return assert_problem(client.get("/readyz"), 503, "NOT_READY")
    finally:
        client.close()


def test_readiness_reports_a_failing_pluggable_check(settings: Settings) -> None:
    body = _readyz_problem(settings, ready_checks={"worker": lambda: "socket not answering"})
    assert "worker: socket not answering" in body["detail"]


def test_readiness_fails_on_an_unmigrated_database(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    settings = Settings(data_dir=root, database_url=f"sqlite:///{root / 'q.db'}", profile=EDGE)
    assert "migrat" in _readyz_problem(settings)["detail"]


def test_readiness_needs_the_worker_socket_when_execution_is_on(settings: Settings) -> None:
    body = _readyz_problem(settings)
    assert "worker: worker socket not answering" in body["detail"]
