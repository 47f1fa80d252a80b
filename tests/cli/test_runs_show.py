"""``qinglong runs show`` says a waiting attempt in a user's words; ``--json`` keeps the API's.

The command runs in this process against the real app on a real database (docs/cli.md):
its requests go through the app's ASGI interface instead of a socket, so no server starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import app.cli.client as commands
from app.cli import main
from app.cli.client.api import Client as CliClient
from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.supervisor.stop_jobs import SERVICE_STOP_REASON
from tests.api.conftest import Client, admin_client_with_a_task, fail_run, make_running
from tests.storage.helpers import TOKEN, start


class _ThroughApp(httpx.BaseTransport):
    """The CLI's requests, answered by the app in this process."""

    def __init__(self, app: Client) -> None:
        self._app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._app.request(
            request.method, request.url.raw_path.decode("ascii"),
            headers=dict(request.headers), content=request.read(),
        )  # fmt: skip
        headers = {
            k: v for k, v in answer.headers.items()
            if k not in ("content-encoding", "content-length")  # already decoded
        }  # fmt: skip
        return httpx.Response(answer.status_code, headers=headers, content=answer.content)


@pytest.fixture
def app_and_admin(db_url: str, tmp_path: Path) -> Iterator[tuple[Settings, Client, str]]:
    settings = Settings(data_dir=tmp_path, database_url=db_url, profile=EDGE)
    client, admin = admin_client_with_a_task(settings)
    try:
        yield settings, client, admin["Authorization"].removeprefix("Bearer ")
    finally:
        client.close()



def _through(monkeypatch: pytest.MonkeyPatch, app: Client, token: str) -> tuple[str, ...]:
    """The CLI's client talks to ``app`` in-process; the flags that point it there."""
    monkeypatch.setattr(
        commands, "Client",
        lambda url, token: CliClient(url, token, transport=_ThroughApp(app)),
    )  # fmt: skip
    return ("--url", "http://testserver", "--token", token)

def test_runs_show_says_a_retry_that_waits_is_waiting_and_json_keeps_claimed(
    app_and_admin: tuple[Settings, Client, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, app, token = app_and_admin
    auth = {"Authorization": f"Bearer {token}"}
    body = {"argv": ["/bin/false"], "retry": {"max_attempts": 2, "initial_delay_seconds": 300}}
    assert app.put("/api/v1/tasks/flaky/revisions/1", json=body, headers=auth).status_code == 201
    run = app.post("/api/v1/runs", json={"task": "flaky"}, headers=auth).json()
    fail_run(settings, run["id"], make_running(settings, run["id"]))  # attempt 2 waits 300 s
    where = _through(monkeypatch, app, token)

    assert main(["runs", "show", run["id"], *where]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^attempt: +2 waiting: a retry, waits until ", shown, re.M), shown
    assert re.search(r"^1 +failed ", shown, re.M), shown  # the attempts table
    assert re.search(r"^2 +waiting +- ", shown, re.M), shown
    assert "claimed" not in shown

    assert main(["runs", "show", run["id"], "--json", *where]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["latest_attempt"]["number"] == 2
    assert doc["latest_attempt"]["status"] == "claimed"  # the API's name: the contract


def test_a_timed_out_run_reads_timed_out_in_words_and_json_keeps_the_api_name(
    app_and_admin: tuple[Settings, Client, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, app, token = app_and_admin
    auth = {"Authorization": f"Bearer {token}"}
    run = app.post("/api/v1/runs", json={"task": "hello"}, headers=auth).json()
    engine = make_engine(settings.database_url)
    try:  # a running job stopped at its time limit, as the worker records it
        running = start(engine, RunReader(engine).get_run(run["id"]))
        assert running.latest_attempt is not None
        repo = RunRepository(engine)
        repo.request_cancel(run_id=run["id"], reason="timeout")
        repo.complete_attempt(
            run_id=run["id"], attempt_id=running.latest_attempt.id, token=TOKEN,
            callback_sequence=1, exit_code=143, signal=None, finished_at_ms=now_ms(),
        )  # fmt: skip
    finally:
        engine.dispose()
    where = _through(monkeypatch, app, token)

    assert main(["runs", "list", *where]) == 0
    listed = capsys.readouterr().out
    assert re.search(rf"^{run['id']} +hello +1 +timed out  ", listed, re.M), listed
    assert main(["runs", "show", run["id"], *where]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^status: +timed out$", shown, re.M), shown
    assert re.search(r"^attempt: +1 timed out: ", shown, re.M), shown
    assert "timed_out" not in listed + shown

    assert main(["runs", "list", "--json", *where]) == 0
    assert json.loads(capsys.readouterr().out)["items"][0]["status"] == "timed_out"
    assert main(["runs", "show", run["id"], "--json", *where]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["latest_attempt"]["status"]) == ("timed_out", "timed_out")


def test_runs_show_names_a_cancel_the_service_asked_on_exit_and_json_keeps_user(
    app_and_admin: tuple[Settings, Client, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, app, token = app_and_admin
    auth = {"Authorization": f"Bearer {token}"}
    run = app.post("/api/v1/runs", json={"task": "hello"}, headers=auth).json()
    make_running(settings, run["id"])
    engine = make_engine(settings.database_url)
    try:  # as serve --stop-jobs-on-exit asks (app/supervisor/stop_jobs.py)
        RunRepository(engine).request_cancel(
            run_id=run["id"], reason=SERVICE_STOP_REASON, service_stop=True
        )
    finally:
        engine.dispose()
    where = _through(monkeypatch, app, token)

    assert main(["runs", "show", run["id"], *where]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^cancel: +service_stop \(serve --stop-jobs-on-exit\) at ", shown, re.M), shown
    assert main(["runs", "show", run["id"], "--json", *where]) == 0
    assert json.loads(capsys.readouterr().out)["cancel_requested"]["reason"] == "user"
