"""The CLI client against a real ``qinglong serve``, on SQLite and on PostgreSQL (docs/cli.md).

One served instance per engine, one journey each (a start costs seconds): the commands a
person types, run as real processes where the exit code, the streaming or the absence of a
traceback is the point, and through ``app.cli.main`` in this process elsewhere (the same
code, the same HTTP, without an interpreter start per command).
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

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
from tests.e2e.kit import enqueue, put_task, wait_status
from tests.kit import web
from tests.worker.kit import kill_exact


def gate(served: Served, name: str) -> Path:
    """A file a job waits for (at most 30 s): what it printed before it must have reached
    the client while the job still ran, however slow the machine."""
    return Path(f"{served.data_dir}.gate-{name}")


def wait_for(path: Path) -> str:
    quoted = shlex.quote(str(path))
    return f"i=0; while [ ! -e {quoted} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"


def hello(served: Served) -> str:
    return f"echo line 1; {wait_for(gate(served, 'hello'))}; echo line 2; echo line 3"


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
    put_task(served, "hello", hello(served))
    put_task(served, "bad", "echo oops; exit 3")
    put_task(served, "long", "echo started; exec sleep 60")
    ticks = "echo tick 1; echo tick 2; echo tick 3"
    put_task(served, "ticker", f"{ticks}; {wait_for(gate(served, 'ticker'))}; echo tick 4")
    r = web.put(
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


def test_the_cli_client_journey(
    cli_served: Served,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    served = cli_served
    # start --follow streams the log as it is written and ends with the status: exit 0.
    with start_follow(served, "hello") as follow:
        first = follow.stdout.readline()
        runs = web.get(f"{served.base_url}/api/v1/runs?task=hello", headers=served.auth)
        hello_id = runs.json()["items"][0]["id"]
        assert first == "line 1\n"
        # line 1 came while the job ran: it waits for the gate, so its run reaches running
        # and stays there. The job can print before T2 is committed, so the status is
        # awaited, not read once.
        wait_status(served, hello_id, {"running"}, timeout=10)
        gate(served, "hello").touch()
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
    # The --url given goes with it, so the command is of the same server; the token never.
    assert err.startswith(f"more: qinglong runs list --url {served.base_url} --limit 1 --cursor ")
    assert served.token not in err
    cursor = err.split("--cursor ")[1].strip()
    assert cursor == page["next_cursor"]
    code, out, _ = run_main(capsys, served, "runs", "list", "--limit", "1", "--cursor", cursor, "--json")
    assert [r["id"] for r in json.loads(out)["items"]] == [hello_id]
    # Every listing pages the same way: the next page's command, ready to type.
    for listing in (["runs", "events", bad_id], ["tasks", "list"]):
        code, out, err = run_main(capsys, served, *listing, "--limit", "1")
        assert code == 0 and len(out.splitlines()) == 2, out  # the header and one row
        hint = f"more: qinglong {' '.join(listing)} --url {served.base_url} --limit 1 --cursor "
        assert err.startswith(hint), err
        cursor = err.split("--cursor ")[1].strip()
        code, out, _ = run_main(capsys, served, *listing, "--limit", "1", "--cursor", cursor)
        assert code == 0 and len(out.splitlines()) == 2, out

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
    assert json.loads(out)["latest"]["argv"] == ["/bin/sh", "-c", hello(served)]

    # secrets: the value from stdin, never printed back; names listed; delete, then 404.
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"s3cret-value\n")))
    code, out, _ = run_main(capsys, served, "secrets", "set", "db-pass")
    assert (code, out) == (0, "secret db-pass set\n")
    code, out, _ = run_main(capsys, served, "secrets", "list")
    assert out.splitlines()[1].split()[0] == "db-pass" and "s3cret" not in out
    code, out, _ = run_main(capsys, served, "secrets", "delete", "db-pass")
    assert code == 0
    code, _, err = run_main(capsys, served, "secrets", "delete", "db-pass")
    assert one_error_line(err) == "error: 404 SECRET_NOT_FOUND: no secret named db-pass"

    # schedules: list, pause, show, resume.
    code, out, _ = run_main(capsys, served, "schedules", "list")
    assert out.splitlines()[1].split()[:6] == ["nightly", "hello", "cron", "0", "3", "29"]
    assert "active" in out.splitlines()[1]
    code, out, _ = run_main(capsys, served, "schedules", "pause", "nightly")
    assert (code, out) == (0, "schedule nightly is paused\n")
    code, out, _ = run_main(capsys, served, "schedules", "show", "nightly")
    assert re.search(r"^state: +paused$", out, re.M) and "+08:00" in out  # the zone's time
    assert re.search(r"^next if resumed: ", out, re.M)  # a paused schedule's fires say so
    code, out, _ = run_main(capsys, served, "schedules", "resume", "nightly", "--json")
    assert json.loads(out)["paused"] is False
    # put and delete: a schedule from flags, then replaced from what show --json printed.
    weekly = ["--task", "hello", "--cron", "0 4 * * 1", "--timezone", "Asia/Shanghai"]
    code, out, err = run_main(capsys, served, "schedules", "put", "weekly", *weekly, "--paused")
    assert code == 0 and out.startswith("schedule weekly created (version 1, paused); next "), err
    assert "+08:00" in out  # the next fire in the schedule's own zone too
    code, shown, _ = run_main(capsys, served, "schedules", "show", "weekly", "--json")
    (tmp_path / "weekly.json").write_text(shown)
    file_args = ["--file", str(tmp_path / "weekly.json"), "--every", "3600"]
    code, out, err = run_main(capsys, served, "schedules", "put", "weekly", *file_args)
    assert code == 0 and out.startswith("schedule weekly saved (version 2, paused)"), err
    code, out, _ = run_main(capsys, served, "schedules", "show", "weekly")
    assert re.search(r"^when: +every 3600s$", out, re.M), out
    # --if-version: against the real api's ETag, a stale version is refused, the current one saved.
    code, _, err = run_main(capsys, served, "schedules", "put", "weekly", *file_args, "--if-version", "1")
    assert code == 3 and "412 PRECONDITION_FAILED: it is at version 2, not 1" in err
    changed = [file_args[0], file_args[1], "--every", "7200", "--if-version", "2"]
    code, out, err = run_main(capsys, served, "schedules", "put", "weekly", *changed)
    assert code == 0 and out.startswith("schedule weekly saved (version 3, paused)"), err
    code, out, err = run_main(capsys, served, "schedules", "decisions", "weekly")
    assert (code, out.split(), err) == (0, ["SLOT", "DECISION", "RUN", "MISSED", "DECIDED"],
                                        "no decisions yet\n")  # paused since it was made
    code, _, err = run_main(capsys, served, "schedules", "put", "weekly", "--task", "hello")
    assert code == 2 and "a schedule needs --task and --cron EXPR or --every SECONDS" in err
    code, out, _ = run_main(capsys, served, "schedules", "delete", "weekly")
    assert (code, out) == (0, "schedule weekly deleted (its queued runs were cancelled; runs"
                           " already started go on to their end: qinglong runs list --status"
                           " running)\n")  # fmt: skip
    code, _, err = run_main(capsys, served, "schedules", "show", "weekly")
    assert code == 3 and "404 SCHEDULE_NOT_FOUND" in err

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
        "error: 401 UNAUTHENTICATED: the token is unknown, revoked or expired (the token from "
        "QL_TOKEN; check it or run `qinglong login`)"
    )

    # login checks the token and writes the 0600 config file the other commands then read.
    config = tmp_path / "home" / ".config" / "qinglong" / "client.toml"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("QL_URL", "QL_TOKEN", "QL_CLIENT_CONFIG", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    capsys.readouterr()
    assert main(["login", "--url", served.base_url, "--token", "ql_" + "B" * 43]) == 3
    assert not config.exists()  # a token the server refuses is not saved
    assert main(["login", "--url", served.base_url, "--token", served.token]) == 0
    assert config.stat().st_mode & 0o777 == 0o600
    capsys.readouterr()
    assert main(["tasks", "list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["items"]) == 4
    config.chmod(0o644)
    assert main(["tasks", "list"]) == 2
    assert "mode 0644, readable by others; run `chmod 600" in one_error_line(
        capsys.readouterr().err
    )
    assert main(["logout"]) == 0 and not config.exists()

    _definitions_reruns_and_retention(served, capsys, monkeypatch, tmp_path)

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
        gate(served, "ticker").touch()
        out, err = rest_of(follow)
    assert follow.returncode == 0, err
    assert first + out == "".join(f"tick {i}\n" for i in range(1, 5))


def _definitions_reruns_and_retention(
    served: Served,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """tasks put (flags, then a file), start --follow, rerun, pin, retention, system."""
    flags = ["--url", served.base_url, "--token", served.token]

    def put(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = main(["tasks", "put", *flags, *args])
        out, err = capsys.readouterr()
        return code, out, err

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"pw-value")))
    assert run_main(capsys, served, "secrets", "set", "greet-pw")[0] == 0
    # The flag form: the recipe first (an env value, a secret by name), then revision 1.
    script = 'echo "$GREETING ${#GREET_PW} $(pwd)"'
    shaped = ["greet", "--cwd", "/tmp", "--timeout", "30", "--env", "GREETING=hi"]
    shaped += ["--secret", "greet-pw", "--", "/bin/sh", "-c", script]
    code, out, err = put(*shaped)
    assert code == 0, err
    recipe_line, rev_line = out.splitlines()
    assert recipe_line.startswith("recipe localctx:sha256:") and "(GREETING, GREET_PW)" in recipe_line
    assert rev_line.startswith("task greet revision 1 created: sha256:")
    code, out, _ = put(*shaped)  # the same again: nothing new
    assert code == 0 and "task greet revision 1 unchanged" in out
    code, out, _ = run_main(capsys, served, "tasks", "show", "greet")
    assert "env keys:        GREETING\n" in out and "secrets:         GREET_PW (greet-pw)" in out
    assert "retry:           -" in out
    # The file form, a flag changing one field: revision 2 (from stdin: `--file -`).
    revision = {"argv": ["/bin/sh", "-c", "echo two"], "timeout_seconds": 30}
    code, out, _ = put("greet", "--file", "-", "--priority", "7", stdin=json.dumps(revision))
    assert code == 0 and "task greet revision 2 created" in out
    code, out, _ = run_main(capsys, served, "tasks", "revisions", "greet", "--json")
    revs = json.loads(out)["items"]
    assert [(r["revision"], r["priority"]) for r in revs] == [(2, 7), (1, 0)]
    assert revs[1]["cwd"] == "/tmp" and revs[1]["recipe"] == recipe_line.split()[1]
    code, out, _ = run_main(capsys, served, "tasks", "revisions", "greet")
    assert [line.split()[0] for line in out.splitlines()] == ["REV", "2", "1"]
    # An edit may start from what `tasks show --json` printed: fed back as it is, nothing new.
    code, shown, _ = run_main(capsys, served, "tasks", "show", "greet", "--json")
    code, out, err = put("greet", "--file", "-", stdin=shown)
    assert code == 0 and "task greet revision 2 unchanged" in out, err
    # A command the api refuses: its 422 as one line, exit 3.
    code, _, err = put("greet", "--", "relative/cmd")
    assert code == 3
    assert one_error_line(err) == (
        "error: 422 INVALID_ARGV: argv[0] must be an absolute path to a program (such as "
        "/usr/bin/python3), or /bin/sh -c SCRIPT for a shell command line"
    )
    # A program that is not there: the run fails, and the last line says why in words.
    assert put("ghost", "--", "/nonexistent/ql-ghost")[0] == 0
    code, _, err = run_main(capsys, served, "runs", "start", "ghost", "--follow")
    assert code == 1
    assert err.splitlines()[-1].endswith(
        " failed (EXECUTOR_START_FAILED: EXEC_FAILED ENOENT: the program, or the interpreter"
        " its #! line names, was not found (a script with Windows line ends names one with a"
        " carriage return))"
    ), err

    # start --follow the new task's revision 1: the recipe's env and secret reach the job.
    code, out, err = run_main(capsys, served, "runs", "start", "greet", "--revision", "1", "-f")
    assert (code, out) == (0, "hi 8 /tmp\n"), err
    first = err.split()[1]
    code, out, _ = run_main(capsys, served, "runs", "events", first)
    types = [line.split()[3] for line in out.splitlines()[1:]]
    assert types[0] == "run.queued" and types[-1] == "run.succeeded", out
    # rerun --follow: a new run of the same revision, trigger.rerun_of the first.
    code, out, err = run_main(capsys, served, "runs", "rerun", first, "--follow")
    assert (code, out) == (0, "hi 8 /tmp\n"), err
    assert f"(rerun of {first}, task greet revision 1)" in err.splitlines()[0]
    again = err.split()[1]
    code, out, _ = run_main(capsys, served, "runs", "show", again)
    assert f"rerun of: {first}" in out and "pinned" not in out
    # pin and unpin (idempotent).
    code, out, _ = run_main(capsys, served, "runs", "pin", again)
    assert (code, out) == (0, f"run {again} pinned: retention keeps its log and rows\n")
    code, out, _ = run_main(capsys, served, "runs", "show", again)
    assert "pinned:   yes" in out
    code, out, _ = run_main(capsys, served, "runs", "unpin", again, "--json")
    assert json.loads(out)["pinned"] is False

    # retention: the table, then flags that change only what they name, then --clear.
    code, out, _ = run_main(capsys, served, "tasks", "retention", "greet")
    assert code == 0 and out.splitlines()[2].split()[:2] == ["keep-runs", "global"]
    code, out, _ = run_main(
        capsys, served, "tasks", "retention", "greet", "--keep-runs", "3", "--keep-rows", "10"
    )
    assert out.splitlines()[2].split() == ["keep-runs", "3", "3"]
    code, out, _ = run_main(capsys, served, "tasks", "retention", "greet", "--keep-days", "2", "--json")
    assert json.loads(out)["override"] == {
        "keep_runs": 3, "keep_days": 2, "keep_rows": 10, "task_log_bytes": None
    }  # fmt: skip
    code, _, err = run_main(capsys, served, "tasks", "retention", "greet", "--keep-rows", "2")
    assert code == 3 and one_error_line(err).startswith("error: 422 VALIDATION_FAILED: ")
    code, out, _ = run_main(capsys, served, "tasks", "retention", "greet", "--clear", "--json")
    assert set(json.loads(out)["override"].values()) == {None}

    # system: storage (admin), token (any token), ready (no token needed).
    code, out, _ = run_main(capsys, served, "system", "storage")
    assert code == 0 and "runs kept:" in out and "reserve:" in out
    code, out, _ = run_main(capsys, served, "system", "token")
    assert code == 0 and "scopes:  admin" in out and "expires: never (until revoked)" in out
    capsys.readouterr()
    assert main(["system", "ready", "--url", served.base_url]) == 0  # no token anywhere
    said = capsys.readouterr().out
    assert said.startswith("ready: database ok, disk ok")
    assert said.splitlines()[1].startswith("process limit: 4096 ")  # as the worker holds it


def test_an_unreachable_server_is_one_line_and_exit_4() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = ql(None, "runs", "list", "--url", url, "--token", "ql_" + "A" * 43)
    assert result.returncode == 4
    line = one_error_line(result.stderr)
    assert line.startswith(f"error: cannot reach {url}: ") and line.endswith(
        "; is the service running there (qinglong serve), and is --url (QL_URL) its address?"
    ), line
    assert result.stdout == ""


def _ql_into(
    served: Served, write_end: int, *args: str, unbuffered: bool
) -> subprocess.Popen[bytes]:
    """``python -m app ARGS`` with stdout on ``write_end`` (closed here once handed over);
    ``unbuffered``: PYTHONUNBUFFERED=1, as many container images set it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    env |= {"QL_URL": served.base_url, "QL_TOKEN": served.token}
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "app", *args], cwd=REPO_ROOT, env=env,
            stdout=write_end, stderr=subprocess.PIPE,
        )  # fmt: skip
    finally:
        os.close(write_end)


def test_output_cut_short_by_a_reader_that_went_away_is_exit_141_without_a_word(
    cli_served: Served,
) -> None:
    served = cli_served
    put_task(served, "big", "head -c 1000000 /dev/zero | tr '\\0' x")  # many pipe buffers
    run_id = enqueue(served, "big")
    assert wait_status(served, run_id, {"succeeded"})["status"] == "succeeded"

    # `| head -c 10`: the reader takes a little of the log and goes while the write is under
    # way. Unbuffered, stdout's one write() takes part and answers its count, with no error.
    read_end, write_end = os.pipe()
    proc = _ql_into(served, write_end, "runs", "logs", run_id, unbuffered=True)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.read(10) == b"x" * 10
    assert proc.communicate(timeout=60)[1] == b""
    assert proc.returncode == 141

    # `--json | head -n 3` after the reader went: buffered, the page fits print()'s buffer,
    # which is written at the end, past the command.
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = _ql_into(served, write_end, "runs", "list", "--json", "--limit", "200", unbuffered=False)
    assert proc.communicate(timeout=60)[1] == b""
    assert proc.returncode == 141


def test_output_that_cannot_be_written_is_one_line_and_exit_74(cli_served: Served) -> None:
    served = cli_served
    run_id = enqueue(served, "bad")
    wait_status(served, run_id, {"failed"})
    for args, unbuffered in (
        (["runs", "logs", run_id], True),
        (["runs", "logs", run_id], False),
        (["tasks", "list"], False),  # a table print() keeps in its buffer until the end
    ):
        full = os.open("/dev/full", os.O_WRONLY)  # `> file` on a full disk
        proc = _ql_into(served, full, *args, unbuffered=unbuffered)
        err = proc.communicate(timeout=60)[1].decode()
        assert one_error_line(err) == "error: cannot write the output: No space left on device"
        assert proc.returncode == 74, args


def test_a_command_started_with_its_output_closed_is_no_traceback(cli_served: Served) -> None:
    # `qinglong runs list >&-`: Python then has no sys.stdout at all (None). The flush that
    # the exit codes 141 and 74 brought raised AttributeError there: a traceback, exit 1.
    served = cli_served
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_URL": served.base_url, "QL_TOKEN": served.token}
    done = subprocess.run(
        ["/bin/sh", "-c", 'exec "$0" -m app runs list >&-', sys.executable], cwd=REPO_ROOT,
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr


def test_a_script_whose_interpreter_is_missing_is_not_called_a_missing_program(
    cli_served: Served, tmp_path: Path
) -> None:
    # A script saved with Windows line ends: its #! line names "/bin/sh\r", so execve says
    # ENOENT although the script is there. "the program was not found" sent its owner
    # looking for a file they could see; the words name the #! line too.
    served = cli_served
    script = tmp_path / "crlf.sh"
    script.write_bytes(b"#!/bin/sh\r\necho hi\r\n")
    script.chmod(0o755)
    tmp_path.chmod(0o755)
    r = web.put(
        f"{served.base_url}/api/v1/tasks/crlf/revisions/1",
        json={"executor": "local_process", "argv": [str(script)]}, headers=served.auth,
    )  # fmt: skip
    assert r.status_code in (200, 201), r.text
    done = ql(served, "runs", "start", "crlf", "--follow")
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1].endswith(
        " failed (EXECUTOR_START_FAILED: EXEC_FAILED ENOENT: the program, or the interpreter"
        " its #! line names, was not found (a script with Windows line ends names one with a"
        " carriage return))"
    ), done.stderr


def test_an_every_schedule_in_a_zone_that_moves_its_local_time_is_warned(
    cli_served: Served,
) -> None:
    # "--every 86400 --timezone Asia/Shanghai" reads as "daily at midnight there", but
    # every_seconds counts from the epoch in UTC: the slots fall at 08:00 in Shanghai. The
    # put said only "next ... 08:00:00+08:00"; it now warns and names --cron.
    served = cli_served
    done = ql(served, "schedules", "put", "daily-sh", "--task", "hello", "--every", "86400",
              "--timezone", "Asia/Shanghai", "--paused")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "warning: --every 86400 counts from 1970-01-01 00:00 UTC, not from midnight in "
        "Asia/Shanghai: its slots fall at 08:00:00 there; for a fixed local time use --cron "
        "(docs/schedules-time.md §1)\n"
    )
    # An interval the zone's offset is a multiple of is the same in either: no warning.
    done = ql(served, "schedules", "put", "hourly-sh", "--task", "hello", "--every", "3600",
              "--timezone", "Asia/Shanghai", "--paused")  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    for name in ("daily-sh", "hourly-sh"):
        assert ql(served, "schedules", "delete", name).returncode == 0


def test_runs_show_says_how_many_processes_the_job_left_were_stopped(
    cli_served: Served,
) -> None:
    # A cron script that starts a daemon with `nohup ... &`: here the daemon is stopped when
    # the script exits and the run succeeds. Only `runs events` told (leftovers_stopped=1);
    # `runs show`, where one looks at a run, said nothing of it.
    served = cli_served
    put_task(served, "daemonizes", "nohup sleep 60 >/dev/null 2>&1 & echo started")
    run_id = enqueue(served, "daemonizes")
    wait_status(served, run_id, {"succeeded"})
    done = ql(served, "runs", "show", run_id)
    assert done.returncode == 0, done.stderr
    said = (
        "stopped:  1 process the job left running, when it ended (a revision with "
        "--leftovers keep lets them live)\n"
    )
    assert said in done.stdout, done.stdout
    # A run that left nothing says nothing of it.
    run_id = enqueue(served, "bad")
    wait_status(served, run_id, {"failed"})
    assert "stopped:" not in ql(served, "runs", "show", run_id).stdout


def test_a_secret_piped_from_a_windows_file_loses_its_whole_line_end(
    cli_served: Served,
) -> None:
    # `qinglong secrets set ck < cookie.txt` of a file saved on Windows: the "one trailing
    # newline" dropped was the \n alone, so the job got the cookie with a \r at its end.
    served = cli_served
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_URL": served.base_url, "QL_TOKEN": served.token}
    done = subprocess.run(
        [sys.executable, "-m", "app", "secrets", "set", "win-cookie"], cwd=REPO_ROOT, env=env,
        input=b"pt_key=abc;\r\n", capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recipe = web.post(
        f"{served.base_url}/api/v1/recipes", json={"env": {}, "secrets": {"CK": "win-cookie"}},
        headers=served.auth,
    ).json()["id"]  # fmt: skip
    put_task(served, "win-cookie", 'printf "[%s]" "$CK"', recipe=recipe)
    run_id = enqueue(served, "win-cookie")
    wait_status(served, run_id, {"succeeded"})
    log = web.get(
        f"{served.base_url}/api/v1/runs/{run_id}/attempts/1/log", headers=served.auth
    )  # the bytes: a text pipe would turn the \r into \n
    assert log.content == b"[pt_key=abc;]"
