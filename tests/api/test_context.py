"""The composition root: dispatcher hooks never block or break a route; readiness is pluggable."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.api.main import create_app
from app.context.bootstrap import build_context
from app.domain.profiles import EDGE
from app.settings import Settings
from app.storage.engine import make_engine
from app.worker.server import ControlServer
from tests.api.conftest import Client, assert_problem, make_running


def test_on_enqueued_runs_in_the_background_after_the_commit(
    settings: Settings, admin: dict[str, str]
) -> None:
    seen: list[int] = []
    called = threading.Event()
    engine = make_engine(settings.database_url)

    def on_enqueued() -> None:
        # The run is already committed when the hook runs: count it from the database.
        from sqlalchemy import text

        with engine.connect() as conn:
            seen.append(conn.execute(text("SELECT count(*) FROM runs")).scalar_one())
        called.set()

    client = Client(create_app(settings, on_enqueued=on_enqueued, execution=False))
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

    client = Client(create_app(settings, on_enqueued=broken, execution=False))
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


class _NoLaunches:
    """The worker side's launcher and controller: a cancel must never reach them."""

    def launch_started(self, request: object) -> object:  # pragma: no cover - never called
        raise AssertionError("a cancel launched something")

    def stop(self, handle: object, *, grace_seconds: float) -> str:  # pragma: no cover
        raise AssertionError("the api stopped a job itself")


def test_a_cancel_of_a_running_run_reaches_the_worker_socket_as_a_wake(
    settings: Settings, admin: dict[str, str], short_dir: Path
) -> None:
    """The real api hook and client against a real control socket: only a running run's
    cancel wakes the worker; an enqueue and a queued run's cancel do not."""
    wakes: list[bool] = []
    woken = threading.Semaphore(0)

    def on_wake(reconcile: bool) -> None:
        wakes.append(reconcile)
        woken.release()

    settings = replace(settings, worker_socket=short_dir / "w.sock")
    unused = _NoLaunches()
    server = ControlServer(
        path=settings.socket_path, launcher=unused, controller=unused,  # type: ignore[arg-type]
        on_wake=on_wake,
    )  # fmt: skip
    server.start()
    # The drain is replaced (no launches to answer); the cancel hook is the real one.
    app = create_app(settings, on_enqueued=lambda: None, periodic=lambda: None)
    client = Client(app)
    try:
        client.put("/api/v1/tasks/t/revisions/1", json={"argv": ["/bin/true"]}, headers=admin)
        queued = client.post("/api/v1/runs", json={"task": "t"}, headers=admin).json()["id"]
        running = client.post("/api/v1/runs", json={"task": "t"}, headers=admin).json()["id"]
        assert client.post(f"/api/v1/runs/{queued}/cancel", headers=admin).status_code == 202
        assert not woken.acquire(timeout=0.5)
        make_running(settings, running)
        assert client.post(f"/api/v1/runs/{running}/cancel", headers=admin).status_code == 202
        assert woken.acquire(timeout=10)
    finally:
        client.close()
        server.close()
    assert wakes == [False]
