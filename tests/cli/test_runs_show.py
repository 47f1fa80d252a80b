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
from app.domain.profiles import EDGE
from app.settings import Settings
from tests.api.conftest import Client, admin_client_with_a_task, fail_run, make_running


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
    monkeypatch.setattr(
        commands, "Client",
        lambda url, token: CliClient(url, token, transport=_ThroughApp(app)),
    )  # fmt: skip
    where = ("--url", "http://testserver", "--token", token)

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
