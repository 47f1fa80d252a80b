"""The CLI client against a real ``qinglong serve``, on SQLite and on PostgreSQL (docs/cli.md).

One served instance per engine, one journey each (a start costs seconds): the commands a
person types, run as real processes where the exit code, the streaming or the absence of a
traceback is the point, and through ``app.cli.main`` in this process elsewhere (the same
code, the same HTTP, without an interpreter start per command).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import IO

import httpx
import pytest

from app.cli import main
from app.domain.tokens import new_api_token
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.tokens_repo import TokenRepository
from tests.conftest import private_pg_schema
from tests.e2e.conftest import (
    REPO_ROOT,
    Served,
    ServeFactory,
    free_port,
    proc_stat,
    wait_until,
)
from tests.e2e.kit import get_run, put_task, wait_status
from tests.worker.kit import kill_exact

HELLO = "echo line 1; sleep 0.6; echo line 2; sleep 0.6; echo line 3"


def ql(served: Served | None, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m app ARGS`` as a user runs it, aimed at ``served`` through QL_URL/QL_TOKEN."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["HOME"] = str(REPO_ROOT / "no-such-home")  # no config file of the person running tests
    if served is not None:
        env |= {"QL_URL": served.base_url, "QL_TOKEN": token or served.token}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def run_main(
    capsys: pytest.CaptureFixture[str], served: Served, *args: str, token: str | None = None
) -> tuple[int, str, str]:
    """``app.cli.main`` in this process; (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main([*args, "--url", served.base_url, "--token", token or served.token])
    out, err = capsys.readouterr()
    return code, out, err


class Follow(subprocess.Popen[str]):
    """A ``runs start TASK --follow`` process with text pipes."""

    stdout: IO[str]
    stderr: IO[str]


def start_follow(served: Served, task: str) -> Follow:
    """``qinglong runs start TASK --follow`` against ``served``; use it in a ``with``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    return Follow(
        [sys.executable, "-m", "app", "runs", "start", task, "--follow"], cwd=REPO_ROOT,
        env=env | {"QL_URL": served.base_url, "QL_TOKEN": served.token},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def rest_of(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The rest of ``proc``'s stdout and its stderr once it exited.

    Not ``communicate()``: it reads the pipes' descriptors and would lose what a
    ``readline()`` already buffered.
    """
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    return out, err


def one_error_line(stderr: str) -> str:
    """The single ``error: ...`` line a failing command prints (no traceback)."""
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def cli_served(
    request: pytest.FixtureRequest, module_serve_factory: ServeFactory
) -> Iterator[Served]:
    """One ``qinglong serve`` per engine for the module, with the journey's definitions."""
    if request.param == "postgres":
        with private_pg_schema("ql_cli") as url:
            served = module_serve_factory(database_url=url)
            try:
                yield _define(served)
            finally:
                served.stop()  # before the schema goes
    else:
        yield _define(module_serve_factory())


def _define(served: Served) -> Served:
    put_task(served, "hello", HELLO)
    put_task(served, "bad", "echo oops; exit 3")
    put_task(served, "long", "echo started; exec sleep 60")
    put_task(served, "ticker", "for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.4; done")
    r = httpx.put(
        f"{served.base_url}/api/v1/schedules/nightly",
        json={"task": "hello", "cron": ["0 3 29 2 *"], "timezone": "Asia/Shanghai"},
        headers=served.auth,
    )
    assert r.status_code == 201, r.text
    return served


def _read_only_token(database_url: str) -> str:
    engine = make_engine(database_url)
    try:
        token = new_api_token()
        TokenRepository(engine).create(
            name=f"ro-{time.time_ns()}", scopes=frozenset({"runs:read", "logs:read"}), token=token
        )
    finally:
        engine.dispose()
    return token


def test_the_cli_client_journey(cli_served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    served = cli_served
    # start --follow streams the log as it is written and ends with the status: exit 0.
    with start_follow(served, "hello") as follow:
        first = follow.stdout.readline()
        runs = httpx.get(f"{served.base_url}/api/v1/runs?task=hello", headers=served.auth)
        hello_id = runs.json()["items"][0]["id"]
        assert first == "line 1\n"
        assert get_run(served, hello_id)["status"] == "running"  # line 1 came while it ran
        out, err = rest_of(follow)
    assert follow.returncode == 0, err
    assert first + out == "line 1\nline 2\nline 3\n"
    assert err.splitlines()[-1] == f"run {hello_id} succeeded (exit 0)"

    # A failing job: its output, its status, exit 1.
    bad = ql(served, "runs", "start", "bad", "--follow")
    assert bad.returncode == 1
    assert bad.stdout == "oops\n"
    assert bad.stderr.splitlines()[-1].endswith(" failed (exit 3)")
    assert "Traceback" not in bad.stderr

    # list: table, filters, --json, keyset paging.
    code, out, _ = run_main(capsys, served, "runs", "list")
    assert code == 0
    assert out.splitlines()[0].split()[:4] == ["RUN", "TASK", "REV", "STATUS"]
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["bad", "hello"]
    code, out, _ = run_main(capsys, served, "runs", "list", "--status", "failed", "--json")
    page = json.loads(out)
    assert [r["task"] for r in page["items"]] == ["bad"] and page["next_cursor"] is None
    bad_id = page["items"][0]["id"]
    code, out, err = run_main(capsys, served, "runs", "list", "--limit", "1", "--json")
    page = json.loads(out)
    assert [r["id"] for r in page["items"]] == [bad_id]
    code, out, err = run_main(capsys, served, "runs", "list", "--limit", "1")
    assert err.startswith("more: qinglong runs list --limit 1 --cursor ")
    cursor = err.split("--cursor ")[1].strip()
    assert cursor == page["next_cursor"]
    code, out, _ = run_main(capsys, served, "runs", "list", "--limit", "1", "--cursor", cursor, "--json")
    assert [r["id"] for r in json.loads(out)["items"]] == [hello_id]

    # show and logs.
    code, out, _ = run_main(capsys, served, "runs", "show", bad_id)
    assert code == 0 and "status:   failed" in out and "1 failed: exit 3" in out
    code, out, _ = run_main(capsys, served, "runs", "show", hello_id, "--json")
    assert json.loads(out)["latest_attempt"]["exit_code"] == 0
    code, out, _ = run_main(capsys, served, "runs", "logs", hello_id, "--json")
    assert json.loads(out)["text"] == "line 1\nline 2\nline 3\n"

    # cancel: the intent, then 409 RUN_TERMINAL as one line with exit 3.
    code, out, _ = run_main(capsys, served, "runs", "start", "long", "--json")
    long_id = json.loads(out)["id"]
    wait_status(served, long_id, {"running"})
    code, out, _ = run_main(capsys, served, "runs", "cancel", long_id)
    assert code == 0 and long_id in out
    wait_status(served, long_id, {"cancelled"})
    code, _, err = run_main(capsys, served, "runs", "cancel", long_id)
    assert code == 3
    assert one_error_line(err) == "error: 409 RUN_TERMINAL: the run already ended (cancelled)"

    # tasks.
    code, out, _ = run_main(capsys, served, "tasks", "list")
    assert [line.split()[0] for line in out.splitlines()] == ["TASK", "bad", "hello", "long", "ticker"]
    code, out, _ = run_main(capsys, served, "tasks", "show", "bad")
    assert "argv:            /bin/sh -c 'echo oops; exit 3'" in out
    code, out, _ = run_main(capsys, served, "tasks", "show", "hello", "--json")
    assert json.loads(out)["latest"]["argv"] == ["/bin/sh", "-c", HELLO]

    # schedules: list, pause, show, resume.
    code, out, _ = run_main(capsys, served, "schedules", "list")
    assert out.splitlines()[1].split()[:6] == ["nightly", "hello", "cron", "0", "3", "29"]
    assert "active" in out.splitlines()[1]
    code, out, _ = run_main(capsys, served, "schedules", "pause", "nightly")
    assert (code, out) == (0, "schedule nightly is paused\n")
    code, out, _ = run_main(capsys, served, "schedules", "show", "nightly")
    assert "state:    paused" in out and "+08:00" in out  # next fires in the schedule's zone
    code, out, _ = run_main(capsys, served, "schedules", "resume", "nightly", "--json")
    assert json.loads(out)["paused"] is False

    # Problems are one line with their code: 404, 403 for a missing scope.
    code, _, err = run_main(capsys, served, "runs", "show", "01a2fa14-0000-7000-8000-000000000000")
    assert (code, one_error_line(err)) == (3, "error: 404 RUN_NOT_FOUND: no such run")
    read_only = _read_only_token(Settings.from_env(served.env).database_url)
    code, _, err = run_main(capsys, served, "runs", "start", "hello", token=read_only)
    assert code == 3
    assert one_error_line(err) == "error: 403 FORBIDDEN: this token lacks the runs:write scope"

    # A bad token, as a real process: one line, exit 3, no traceback.
    denied = ql(served, "runs", "list", token="ql_" + "A" * 43)
    assert denied.returncode == 3
    assert one_error_line(denied.stderr) == (
        "error: 401 UNAUTHENTICATED: the token is unknown or revoked"
    )

    if served.env.get("QL_DATABASE_URL"):
        return  # the resume is the client's own: SQLite shows it once
    # The api is killed while a follow streams: the supervisor restarts it and the client
    # resumes from its last offset (Last-Event-ID): every line once, in order, exit 0.
    with start_follow(served, "ticker") as follow:
        first = follow.stdout.readline()
        api = served.service_pids()["api"]
        stat = proc_stat(api)
        assert stat is not None
        kill_exact(api, stat[3])
        wait_until("the api restarted", lambda: served.service_pids().get("api", api) != api, 30)
        out, err = rest_of(follow)
    assert follow.returncode == 0, err
    assert first + out == "".join(f"tick {i}\n" for i in range(1, 7))


def test_an_unreachable_server_is_one_line_and_exit_4() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = ql(None, "runs", "list", "--url", url, "--token", "ql_" + "A" * 43)
    assert result.returncode == 4
    assert one_error_line(result.stderr).startswith(f"error: cannot reach {url}: ")
    assert result.stdout == ""
