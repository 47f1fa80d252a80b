"""The CLI client's pure parts: tables, one-line problems, SSE and its resume, the config file,
the bodies of ``tasks put`` and ``tasks retention``.

The commands against a real ``qinglong serve`` are tests/e2e/test_cli_client.py.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from app.cli import _is_client_command, main
from app.cli.client import bodies, render
from app.cli.client.api import (
    EXIT_API_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    ApiProblem,
    Client,
    ClientError,
    LogChunk,
    LogEnd,
    parse_sse,
    problem_message,
    public_url,
)
from app.cli.client.config import ConfigRefused, config_path, read_config, resolve, write_config
from app.domain import validation
from app.domain.validation import NAME_RULE

RUN = {
    "id": "01a2-run",
    "task": "hello",
    "revision": 2,
    "status": "failed",
    "priority": 0,
    "version": 5,
    "created_at_ms": 0,
    "started_at_ms": 1_000,
    "finished_at_ms": 66_000,
    "cancel_requested": None,
    "trigger": {"kind": "schedule", "schedule": "nightly", "slot_ms": 0},
    "latest_attempt": {
        "number": 1,
        "status": "failed",
        "exit_code": 3,
        "signal": None,
        "error_code": None,
        "started_at_ms": 1_000,
        "finished_at_ms": 66_000,
        "log": {"bytes": 10, "truncated": True, "dropped_bytes": 7, "truncation_reason": "quota"},
    },
}


def test_runs_table_aligns_columns_and_shows_the_outcome() -> None:
    other = RUN | {"id": "x", "task": "a-much-longer-task", "status": "queued"}
    other |= {"started_at_ms": None, "finished_at_ms": None, "latest_attempt": None}
    lines = render.runs_table([RUN, other], tz=UTC).splitlines()
    assert lines[0].split() == ["RUN", "TASK", "REV", "STATUS", "CREATED", "TOOK", "OUTCOME"]
    assert lines[1].split() == [
        "01a2-run", "hello", "2", "failed", "1970-01-01", "00:00:00", "1m05s", "exit", "3",
    ]  # fmt: skip
    assert lines[2].split()[-2:] == ["-", "-"]
    # Every column starts at the same place on every line.
    col = lines[0].index("STATUS")
    assert lines[1][col:].startswith("failed") and lines[2][col:].startswith("queued")


def test_run_fields_say_trigger_truncation_and_outcome_in_words() -> None:
    text = render.run_fields(RUN, tz=UTC)
    assert "trigger:  schedule nightly, slot 1970-01-01 00:00:00\n" in text
    assert "attempt:  1 failed: exit 3" in text
    assert "truncated (7 bytes dropped: quota)" in text
    assert "took:     1m05s" in text
    assert "expired" not in text


def test_a_launch_that_failed_is_told_in_words_from_its_ending_event() -> None:
    def said(**data: str) -> str:
        return render.start_failure({"error_code": "EXECUTOR_START_FAILED", **data})

    assert said(start_failure="EXEC_FAILED", errno="ENOENT") == (
        "EXEC_FAILED ENOENT: the program, or the interpreter its #! line names, was not found"
        " (a script with Windows line ends names one with a carriage return)"
    )  # execve's ENOENT for a script that is there: "/bin/sh\r" on its #! line
    assert said(start_failure="EXEC_FAILED", errno="ENOEXEC").endswith(
        "(a script without its #! line?)"
    )  # the usual cause: cron ran scripts through sh, a job runs argv as it is
    assert said(start_failure="CWD_INVALID", errno="ENOENT") == (
        "CWD_INVALID ENOENT: the working directory does not exist"
    )
    assert said(start_failure="RUN_AS_NOT_ALLOWED").startswith("RUN_AS_NOT_ALLOWED: the job's")
    assert said(start_failure="EXEC_FAILED", errno="EIO") == "EXEC_FAILED EIO"  # codes alone
    assert said(start_failure="SHIM_FAILED") == "SHIM_FAILED"
    assert said() == ""  # an ending without a launch reason (an older api's, or not a launch)
    assert said(secret="db-pass") == (
        "secret db-pass does not exist; set it with `qinglong secrets set db-pass`"
    )
    failed = RUN | {"latest_attempt": {"number": 1, "status": "failed",
                                       "error_code": "EXECUTOR_START_FAILED"}}  # fmt: skip
    text = render.run_fields(failed, tz=UTC, why_not_started="EXEC_FAILED ENOENT: the program was not found")
    assert "attempt:  1 failed: EXECUTOR_START_FAILED (EXEC_FAILED ENOENT: the program was not found)" in text


def test_an_attempt_with_no_outcome_yet_is_not_followed_by_a_dash() -> None:
    # "attempt:  1 waiting: -" read as waiting for nothing; the run's "waiting:" line above
    # says what holds it. A running attempt has no outcome yet either.
    for status, shown in (("claimed", "waiting"), ("running", "running")):
        attempt = {"number": 1, "status": status, "log": {"bytes": 0}}
        text = render.run_fields(RUN | {"status": "queued", "latest_attempt": attempt}, tz=UTC)
        assert f"attempt:  1 {shown}\n" in text, text


def test_run_fields_say_when_retention_removed_the_log() -> None:
    attempt = dict(cast(dict[str, Any], RUN["latest_attempt"]))
    attempt["log"] = {"bytes": 6, "truncated": False, "expired": True, "expired_at_ms": 86_400_000}
    text = render.run_fields(RUN | {"latest_attempt": attempt}, tz=UTC)
    assert "log:      6 bytes, expired 1970-01-02 00:00:00: retention removed it" in text


def test_schedule_fields_give_the_catchup_window_only_under_latest() -> None:
    # The window bounds what "latest" fires; "all" and "none" never read it
    # (docs/schedules-time.md §4), so "all within 60 s" would promise a bound that is not.
    schedule = {
        "name": "n", "task": "t", "revision": None, "every_seconds": 60, "timezone": "UTC",
        "overlap": "skip", "max_concurrent": 1, "catchup": "latest", "catchup_window_seconds": 60,
        "jitter_seconds": 0, "dst_gap": "shift", "dst_fold": "first", "paused": False,
        "version": 1, "updated_at_ms": 0, "next_fires": [],
    }  # fmt: skip
    assert "catch-up: latest within 60 s\n" in render.schedule_fields(schedule, tz=UTC)
    for catchup in ("all", "none"):
        text = render.schedule_fields(schedule | {"catchup": catchup}, tz=UTC)
        assert f"catch-up: {catchup}\n" in text and "within" not in text


def test_run_fields_say_what_holds_a_queued_run_back() -> None:
    queued = RUN | {"status": "queued", "latest_attempt": None}
    said = {
        "max_running": "for a free slot: 2 runs are active, QL_MAX_RUNNING allows 2",
        "max_concurrent": "for its task: 1 of its runs is active, its revision allows 1",
        "held": "behind an older run of its schedule that has not ended (queue_one, replace)",
        "worker": "for the worker: the service's last try to start a run found none answering",
        "disk": "for free space: the service's last try found too little (system ready says)",
        "later\x1b[2J": "later\\x1b[2J",  # a reason a later service names, made safe
    }
    for reason, words in said.items():
        limit = {"max_running": 2, "max_concurrent": 1}.get(reason)
        run = queued | {"waiting": {"reason": reason, "limit": limit, "active": limit}}
        text = render.run_fields(run, tz=UTC)
        assert f"status:   queued\nwaiting:  {words}\n" in text, text
    assert "waiting" not in render.run_fields(queued, tz=UTC)


def test_run_fields_say_a_retry_waits_and_until_when() -> None:
    waiting = {"number": 2, "status": "claimed", "exit_code": None, "signal": None,
               "error_code": None, "started_at_ms": None, "finished_at_ms": None, "log": {}}  # fmt: skip
    run = RUN | {"status": "queued", "latest_attempt": waiting, "next_attempt_at_ms": 4_102_444_800_000}
    text = render.run_fields(run, tz=UTC)
    assert "attempt:  2 waiting: a retry, waits until 2100-01-01 00:00:00" in text


def test_schedule_fields_say_ended_bounds_and_max_only_under_allow() -> None:
    schedule = {
        "name": "n", "task": "t", "revision": None, "every_seconds": 60, "timezone": "UTC",
        "overlap": "skip", "max_concurrent": 2, "catchup": "latest", "catchup_window_seconds": 60,
        "jitter_seconds": 0, "dst_gap": "shift", "dst_fold": "first", "paused": False,
        "start_at_ms": 0, "end_at_ms": 60_000, "version": 1, "updated_at_ms": 0, "next_fires": [],
    }  # fmt: skip
    text = render.schedule_fields(schedule, tz=UTC)
    assert "state:    ended" in text and "overlap:  skip\n" in text
    assert "bounds:   from 1970-01-01 00:00:00, until 1970-01-01 00:01:00" in text
    assert "dst:" not in text  # an interval never meets a DST gap or fold
    nightly = schedule | {"every_seconds": None, "cron": ["0 3 * * *"]}
    assert "dst:      gap shift, fold first\n" in render.schedule_fields(nightly, tz=UTC)
    assert "allow (max 2)" in render.schedule_fields(schedule | {"overlap": "allow"}, tz=UTC)
    assert render.schedule_state(schedule | {"end_at_ms": None}) == "active"
    assert render.schedule_state(schedule | {"paused": True}) == "paused"
    assert render.schedules_table([schedule]).splitlines()[1].split()[5] == "ended"  # every 60s: 2 words
    # The next fire in the schedule's own zone, with its offset, beside the ZONE column.
    fires = [{"at_ms": 0, "local": "1970-01-01T08:00:00+08:00"}]
    shanghai = schedule | {"end_at_ms": None, "timezone": "Asia/Shanghai", "next_fires": fires}
    row = render.schedules_table([shanghai], tz=UTC).splitlines()[1].split()
    assert row[4:] == ["Asia/Shanghai", "active", "1970-01-01", "08:00:00+08:00"]
    # Paused: the next slot is where it would fire, only if resumed by then.
    paused = shanghai | {"paused": True}
    row = render.schedules_table([paused], tz=UTC).splitlines()[1].split()
    assert row[4:] == ["Asia/Shanghai", "paused", "1970-01-01", "08:00:00+08:00", "if", "resumed"]
    assert "next if resumed: 1970-01-01 00:00:00" in render.schedule_fields(paused, tz=UTC)
    assert "\nnext:" in render.schedule_fields(shanghai, tz=UTC)


def test_decisions_table_names_the_run_and_the_missed_span() -> None:
    decided = [
        {"slot_ms": 180_000, "decision": "fired", "run": "r3", "count": None,
         "until_slot_ms": None, "at_ms": 180_002},
        {"slot_ms": 60_000, "decision": "missed", "run": None, "count": 2,
         "until_slot_ms": 120_000, "at_ms": 180_001},
    ]  # fmt: skip
    lines = render.decisions_table(decided, tz=UTC).splitlines()
    assert lines[0].split() == ["SLOT", "DECISION", "RUN", "MISSED", "DECIDED"]
    assert lines[1].split()[2:5] == ["fired", "r3", "-"]
    assert lines[2].split()[2:8] == ["missed", "-", "2", "slots,", "to", "1970-01-01"]


def test_user_strings_cannot_drive_the_terminal() -> None:
    evil = "bad\x1b[2J\rname\u202e"
    cell = render.table(["TASK"], [[evil]]).splitlines()[1]
    assert "\x1b" not in cell and "\r" not in cell and "\u202e" not in cell
    assert cell == "bad\\x1b[2J name\\u202e"  # a CR is whitespace: one space on one line
    assert render.safe("a\rb\x07") == "a\\x0db\\x07"
    assert render.one_line("a\n  b\tc") == "a b c"
    assert len(render.one_line("x" * 500, limit=20)) == 20


def test_durations_and_missing_times() -> None:
    assert render.duration(0, 4_200) == "4.2s"
    assert render.duration(0, 3_725_000) == "1h02m"
    assert render.duration(None, 5) == "-"
    assert render.when(None) == "-"


def test_a_problem_becomes_one_line_with_status_code_and_detail() -> None:
    body = json.dumps(
        {"type": "urn:qinglong:problem:FORBIDDEN", "title": "Forbidden", "status": 403,
         "detail": "this token lacks the runs:write scope", "code": "FORBIDDEN"}
    ).encode()  # fmt: skip
    problem = problem_message(403, "Forbidden", body, httpx.Headers())
    assert problem.message == "403 FORBIDDEN: this token lacks the runs:write scope"
    assert (problem.status, problem.code, problem.exit_code) == (403, "FORBIDDEN", EXIT_API_ERROR)
    queue = json.dumps({"code": "QUEUE_FULL", "detail": "too many\nqueued"}).encode()
    full = problem_message(429, "Too Many Requests", queue, httpx.Headers({"Retry-After": "5"}))
    assert full.message == "429 QUEUE_FULL: too many queued (retry after 5 s)"


def test_an_answer_that_is_not_problem_json_still_gets_one_line() -> None:
    html = b"<html><body>502 Bad Gateway</body></html>"
    problem = problem_message(502, "Bad Gateway", html, httpx.Headers())
    assert problem.code is None
    assert problem.message.startswith("502 Bad Gateway: the answer is not a problem+json")
    assert "\n" not in problem.message


def test_urls_in_messages_lose_their_user_info() -> None:
    assert public_url("https://user:pw@host:8443/base?x=1") == "https://host:8443/base"


def test_bad_urls_are_usage_errors() -> None:
    for url in ("ftp://host", "http://[bad", "127.0.0.1:8000"):
        with pytest.raises(ClientError) as caught:
            Client(url, "t")
        assert caught.value.exit_code == EXIT_USAGE


def test_sse_parsing_skips_heartbeats_and_joins_data_lines() -> None:
    lines = [": heartbeat", "", "event: chunk", "id: 4", 'data: {"offset": 0,', 'data: "text": "abc\\n"}', ""]
    lines += ["event: end", 'data: {"status": "succeeded", "bytes": 4}']
    events = list(parse_sse(iter(lines)))
    assert events == [
        ("chunk", '{"offset": 0,\n"text": "abc\\n"}', "4"),
        ("end", '{"status": "succeeded", "bytes": 4}', None),
    ]


def _sse(*events: str) -> bytes:
    return "".join(events).encode()


def _chunk(offset: int, text: str) -> str:
    after = offset + len(text.encode())
    return f"event: chunk\nid: {after}\ndata: {json.dumps({'offset': offset, 'text': text})}\n\n"


def test_a_follow_resumes_from_the_last_offset_after_the_stream_breaks() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("last-event-id"))
        assert request.url.params["follow"] == "true"
        if len(seen) == 1:  # the api went away after one chunk (no end event)
            return httpx.Response(200, content=_sse(": heartbeat\n\n", _chunk(0, "one\n")))
        if len(seen) == 2:  # restarting
            raise httpx.ConnectError("connection refused")
        if len(seen) == 3:
            problem = {"code": "NOT_READY", "detail": "starting"}
            return httpx.Response(503, json=problem)
        end = 'event: end\ndata: {"status": "succeeded", "bytes": 8}\n\n'
        return httpx.Response(200, content=_sse(_chunk(4, "two\n"), end))

    client = Client("http://api.test", "t", transport=httpx.MockTransport(answer), sleep=lambda _: None)
    items = list(client.follow("r1", 1))
    assert items == [
        LogChunk("one\n", 4), LogChunk("two\n", 8), LogEnd("succeeded", 8)
    ]  # fmt: skip
    assert seen == [None, "4", "4", "4"]


def test_a_follow_ended_by_the_server_for_the_token_is_a_401_line() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        err = json.dumps({"code": "UNAUTHENTICATED", "detail": "the token is unknown, revoked or expired"})
        return httpx.Response(200, content=_sse(_chunk(0, "a"), f"event: error\ndata: {err}\n\n"))

    client = Client("http://api.test", "t", transport=httpx.MockTransport(answer), sleep=lambda _: None)
    with pytest.raises(ApiProblem) as caught:
        list(client.follow("r1", 1))
    assert caught.value.message.startswith("401 UNAUTHENTICATED: the token is unknown, revoked or expired")


def test_a_follow_stops_on_a_final_problem() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"code": "RUN_NOT_FOUND", "detail": "no such run"})

    client = Client("http://api.test", "t", transport=httpx.MockTransport(answer), sleep=lambda _: None)
    with pytest.raises(ApiProblem, match="404 RUN_NOT_FOUND: no such run"):
        list(client.follow("r1", 1))


# -- the config file (real files under tmp_path) --------------------------------------------


def test_login_writes_a_0600_file_that_resolve_reads(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "qinglong" / "client.toml"
    write_config(path, url="http://127.0.0.1:9", token='ql_abc"\\')
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    env = {"QL_CLIENT_CONFIG": str(path)}
    target = resolve(None, None, env)
    assert (target.url, target.token) == ("http://127.0.0.1:9", 'ql_abc"\\')
    # Flags beat the environment, which beats the file.
    env |= {"QL_URL": "http://env:1", "QL_TOKEN": "ql_env"}
    assert resolve(None, None, env).token == "ql_env"
    assert resolve("http://flag:2", "ql_flag", env).url == "http://flag:2"
    # Where the token came from, for a 401's line.
    assert target.token_from == f"the config file {path}"
    assert resolve(None, None, env).token_from == "QL_TOKEN"
    assert resolve(None, "ql_flag", env).token_from == "--token"


def test_a_config_file_others_can_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "client.toml"
    write_config(path, url="http://127.0.0.1:9", token="ql_secret")
    path.chmod(0o644)
    with pytest.raises(ConfigRefused) as caught:
        resolve(None, None, {"QL_CLIENT_CONFIG": str(path)})
    assert caught.value.message == (
        f"config file {path} has mode 0644, readable by others; run `chmod 600 {path}`"
    )
    assert "ql_secret" not in caught.value.message
    assert caught.value.exit_code == EXIT_USAGE


def test_a_symlinked_or_broken_config_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.toml"
    write_config(real, url="http://127.0.0.1:9", token="ql_x")
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    with pytest.raises(ConfigRefused, match="symlink"):
        read_config(link)
    real.write_text("token = [")
    real.chmod(0o600)
    with pytest.raises(ConfigRefused, match="not valid TOML"):
        read_config(real)


def test_no_token_anywhere_says_how_to_give_one(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert config_path(env) == tmp_path / ".config" / "qinglong" / "client.toml"
    with pytest.raises(ClientError, match="pass --token, set QL_TOKEN or run `qinglong login`"):
        resolve(None, None, env)
    with pytest.raises(ClientError, match="pass --token"):
        resolve(None, "  ", env)


@pytest.mark.parametrize("token", ["ключ", "ql_a\nb", "ql_a b"])
def test_a_token_that_cannot_be_a_header_is_refused_without_echoing_it(token: str) -> None:
    with pytest.raises(ClientError) as caught:
        resolve("http://127.0.0.1:9", token, {})
    assert caught.value.exit_code == EXIT_USAGE
    assert token not in caught.value.message and "non-ASCII" in caught.value.message


def test_client_commands_are_told_from_the_service_commands() -> None:
    assert _is_client_command(["runs", "list"])
    assert _is_client_command(["--data-dir", "runs", "tasks", "list"])  # DIR is "runs"
    assert _is_client_command(["--data-dir", "/d", "schedules", "show", "x"])
    assert _is_client_command(["secrets", "set", "name"])
    assert not _is_client_command(["secrets", "rotate-key"])
    assert not _is_client_command(["secrets"])
    assert not _is_client_command(["serve", "--port", "1"])
    assert not _is_client_command([])


def _main_against(
    monkeypatch: pytest.MonkeyPatch, answer: httpx.Response, *args: str
) -> int:
    import app.cli.client as commands

    def client(url: str, token: str) -> Client:
        return Client(url, token, transport=httpx.MockTransport(lambda _: answer))

    monkeypatch.setattr(commands, "Client", client)
    return main([*args, "--url", "http://api.test", "--token", "ql_t"])


@pytest.mark.parametrize(
    "args",
    [["runs", "show", ""], ["runs", "logs", ""], ["runs", "cancel", ""], ["tasks", "show", ""],
     ["schedules", "delete", ""], ["secrets", "delete", ""]],
)  # fmt: skip
def test_an_empty_id_or_name_is_refused_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    # `qinglong runs show "$RUN"` with RUN unset asked for /runs/, and the 404 blamed --url:
    # "no such resource under ...: is that the service's root url ...?".
    sent = httpx.Response(500, json={"detail": "a request was sent"})
    assert _main_against(monkeypatch, sent, *args) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "error: an empty id or name was given (an unset shell variable?); nothing was sent\n"
    )


@pytest.mark.parametrize(
    ("args", "value"),
    [(["runs", "show", "."], "."), (["runs", "logs", ".."], ".."),
     (["tasks", "show", "a/b"], "a/b"), (["tasks", "retention", "..", "--keep-runs", "1"], ".."),
     (["schedules", "show", "a/b"], "a/b"), (["schedules", "delete", "../tasks"], "../tasks"),
     (["runs", "pin", "a/b"], "a/b")],
)  # fmt: skip
def test_a_name_the_url_cannot_carry_is_refused_before_anything_is_sent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
    value: str,
) -> None:
    # `runs show .` asked for /runs/ (the url drops a . segment) and printed "the server's
    # answer is not what this client expects (KeyError)"; `tasks show a/b` sent %2F, which the
    # api's router reads as /, and the 404 blamed --url.
    sent = httpx.Response(500, json={"detail": "a request was sent"})
    assert _main_against(monkeypatch, sent, *args) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"error: {value} is not a name or run id: none holds a / or is . or ..; nothing was"
        " sent\n"
    )


_ENDED = {"name": "once", "task": "t", "every_seconds": 60, "timezone": "UTC", "paused": False,
          "end_at_ms": 1000, "version": 1, "next_fires": []}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "status", "line"),
    [(["schedules", "resume", "once"], 200,
      "schedule once is ended: its end bound, {end}, has passed; no slot after it fires\n"),
     (["schedules", "put", "once", "--task", "t", "--every", "60"], 201,
      "schedule once created (version 1, ended)\n")],
)  # fmt: skip
def test_a_schedule_past_its_end_bound_is_never_said_to_be_active(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
    status: int, line: str,
) -> None:
    # `schedules resume once` of a schedule whose end_at_ms had passed said "schedule once is
    # active", while `schedules list` and `show` said ended: no slot of it is left to fire.
    answer = httpx.Response(status, json=_ENDED)
    assert _main_against(monkeypatch, answer, *args) == EXIT_OK
    assert capsys.readouterr().out == line.format(end=render.when(1000))


def test_pinning_a_run_whose_log_retention_removed_does_not_promise_its_log(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "retention keeps its log and rows" of a run whose log was gone (410 LOG_EXPIRED).
    log = {"bytes": 41, "truncated": False, "expired": True, "expired_at_ms": 1000}
    run = {"id": "r1", "pinned": True, "latest_attempt": {"number": 1, "log": log}}
    assert _main_against(monkeypatch, httpx.Response(200, json=run), "runs", "pin", "r1") == 0
    assert capsys.readouterr().out == (
        f"run r1 pinned: retention keeps its rows; its log was removed {render.when(1000)},"
        " before the pin\n"
    )
    kept = {**run, "latest_attempt": {"number": 1, "log": {**log, "expired": False}}}
    assert _main_against(monkeypatch, httpx.Response(200, json=kept), "runs", "pin", "r1") == 0
    assert capsys.readouterr().out == "run r1 pinned: retention keeps its log and rows\n"


def test_tasks_retention_says_the_service_sweeps_nothing_under_retention_off() -> None:
    # Under QL_RETENTION=off the IN FORCE column read as applied while nothing is swept.
    fields = {"keep_runs": 1, "keep_days": 14, "keep_rows": 1000, "task_log_bytes": None}
    policy = {"task": "t", "override": {}, "effective": fields, "retention_enabled": False}
    shown = render.retention_table(policy)
    assert shown.endswith(
        "\nretention is off on this service (QL_RETENTION=off): no sweep runs, so nothing is"
        " deleted whatever is in force"
    ), shown
    assert "retention is off" not in render.retention_table(policy | {"retention_enabled": True})
    assert "retention is off" not in render.retention_table(  # an older server's answer
        {k: v for k, v in policy.items() if k != "retention_enabled"}
    )


class _UnreadStdin(io.StringIO):
    def isatty(self) -> bool:
        return False

    def read(self, size: int | None = -1) -> str:
        raise AssertionError("the value was read")


def test_a_secret_name_the_api_would_refuse_is_refused_before_its_value_is_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", _UnreadStdin())
    sent = httpx.Response(500, json={"detail": "a request was sent"})
    assert _main_against(monkeypatch, sent, "secrets", "set", "Bad Name") == EXIT_USAGE
    assert "a secret's name is lower-case letters" in capsys.readouterr().err
    # The client's copy of the rule is the api's own.
    assert bodies.NAME.pattern == NAME_RULE


@pytest.mark.parametrize(
    ("answer", "line"),
    [
        (
            httpx.Response(200, json={"items": [{"id": "r"}]}),  # no task, status, ...
            "error: the server's answer is not what this client expects (KeyError); "
            "is --url a qinglong api of this version?",
        ),
        (
            httpx.Response(200, text="<html>a login page</html>"),
            "error: http://api.test/api/v1/runs answered 200 without JSON",
        ),
        (
            httpx.Response(502, text="<html>Bad Gateway</html>"),
            "error: 502 Bad Gateway: the answer is not a problem+json document "
            "(is --url the qinglong api?)",
        ),
    ],
)
def test_a_strange_answer_is_one_line_and_exit_3(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answer: httpx.Response,
    line: str,
) -> None:
    assert _main_against(monkeypatch, answer, "runs", "list") == 3
    assert capsys.readouterr().err == line + "\n"


# -- bodies of tasks put and tasks retention (app/cli/client/bodies.py) ---------------------


def _flags(**given: object) -> dict[str, object]:
    names = [*bodies.REVISION_FLAGS, *bodies.RETRY_FLAGS, "retry_jitter", "retry_no_jitter"]
    return {name: None for name in names} | given


def test_tasks_put_flags_become_the_revision_and_recipe_bodies() -> None:
    flags = _flags(cwd="/srv", timeout=60, priority=0, max_concurrent=2, leftovers="keep")
    flags |= {"retry_max_attempts": 3, "retry_delay": 0.0, "retry_on": ["failed", "lost"]}
    body = bodies.revision_body(None, ["/bin/sh", "-c", "echo hi -- x"], flags, recipe="r1")
    assert body == {
        "argv": ["/bin/sh", "-c", "echo hi -- x"], "cwd": "/srv", "timeout_seconds": 60,
        "priority": 0, "max_concurrent": 2, "leftovers": "keep", "recipe": "r1",
        "retry": {"max_attempts": 3, "initial_delay_seconds": 0.0, "on": ["failed", "lost"]},
    }  # fmt: skip
    recipe = bodies.recipe_body(["MODE=a=b", "EMPTY="], ["db-password", "API=api.key", "x.y"])
    assert recipe == {
        "env": {"MODE": "a=b", "EMPTY": ""},
        "secrets": {"DB_PASSWORD": "db-password", "API": "api.key", "X_Y": "x.y"},
    }
    assert bodies.recipe_body([], []) is None


def test_a_file_saved_with_a_byte_order_mark_is_read_as_json() -> None:
    # Notepad's "UTF-8 with BOM": it was "not JSON (Unexpected UTF-8 BOM (decode using
    # utf-8-sig) ...)", a Python hint a user editing a task or schedule file cannot act on.
    text = '\ufeff{"argv": ["/bin/true"]}'
    assert bodies.load_revision_file(text, source="t.json") == {"argv": ["/bin/true"]}
    text = '\ufeff{"task": "tick", "every_seconds": 60}'
    assert bodies.load_schedule_file(text, source="s.json")["every_seconds"] == 60


def test_a_revision_file_is_the_base_the_flags_change() -> None:
    text = '{"argv": ["/usr/bin/env"], "priority": 5, "retry": {"max_attempts": 2}}'
    base = bodies.load_revision_file(text, source="rev.json")
    body = bodies.revision_body(base, [], _flags(priority=-1, retry_no_jitter=True))
    assert body == {"argv": ["/usr/bin/env"], "priority": -1,
                    "retry": {"max_attempts": 2, "jitter": False}}  # fmt: skip
    assert bodies.revision_body(base, ["/bin/true"], _flags())["argv"] == ["/bin/true"]
    # What to do instead is said: a user who only meant to change one --env is not stuck.
    with pytest.raises(ClientError, match='the file names; delete "recipe" from the file and '
                       "give every key again with --env/--secret"):  # fmt: skip
        bodies.revision_body(base | {"recipe": "other"}, [], _flags(), recipe="mine")


def test_retry_flags_without_a_second_attempt_are_refused_and_jitter_can_be_turned_on() -> None:
    with pytest.raises(ClientError, match="does nothing: with one attempt in all"):
        bodies.revision_body(None, ["/bin/true"], _flags(retry_delay=5.0))
    with pytest.raises(ClientError, match="does nothing"):
        bodies.revision_body(None, ["/bin/true"], _flags(retry_max_attempts=1, retry_jitter=True))
    # The file's max_attempts counts; max_attempts 1 alone turns retries off, as asked.
    base = {"argv": ["/bin/true"], "retry": {"max_attempts": 3, "jitter": False}}
    body = bodies.revision_body(base, [], _flags(retry_delay=5.0, retry_jitter=True))
    assert body["retry"] == {"max_attempts": 3, "jitter": True, "initial_delay_seconds": 5.0}
    off = bodies.revision_body(base, [], _flags(retry_max_attempts=1))
    assert off["retry"] == {"max_attempts": 1, "jitter": False}


def test_a_revision_file_may_be_what_the_api_printed_without_its_output_only_fields() -> None:
    printed = {"task": "a", "revision": 3, "executor": "local_process", "argv": ["/bin/true"],
               "cwd": None, "recipe": None, "timeout_seconds": 30, "priority": 0,
               "leftovers": "kill", "run_as": None, "max_concurrent": None, "retry": None,
               "digest": "sha256:" + "0" * 64, "created_at_ms": 1}  # fmt: skip
    output_only = ("task", "revision", "digest", "created_at_ms")
    body = {k: v for k, v in printed.items() if k not in output_only}
    # One revision (`tasks revisions --json`'s items), or a task (`tasks show --json`).
    assert bodies.load_revision_file(json.dumps(printed), source="r.json") == body
    shown = {"task": "a", "latest_revision": 3, "latest": printed}
    assert bodies.load_revision_file(json.dumps(shown), source="r.json") == body
    with pytest.raises(ClientError, match="its latest is not a JSON object"):
        bodies.load_revision_file(json.dumps(shown | {"latest": 3}), source="r.json")
    # A body that happens to have a field named like the task's is a body: kept as written.
    assert bodies.load_revision_file('{"argv": ["/bin/true"], "latest": 1}', source="r") == {
        "argv": ["/bin/true"], "latest": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: bodies.revision_body(None, [], {}), "no command: give it after --"),
        (lambda: bodies.key_values(["NOEQUALS"], flag="--env"), "--env takes KEY=VALUE"),
        (lambda: bodies.key_values(["=v"], flag="--env"), "--env takes KEY=VALUE"),
        (lambda: bodies.key_values(["A=1", "A=2"], flag="--env"), "names the key A twice"),
        (lambda: bodies.secret_refs(["9lives"]), "give it as --secret KEY=NAME"),
        (lambda: bodies.secret_refs(["a-b", "A_B=c"]), "names the key A_B twice"),
        # A panel's env name given as the secret's: the api's 422 named the rule only.
        # NAME allows '_': jd_cookie is the name `secrets set jd_cookie` made, same key.
        (lambda: bodies.secret_refs(["JD_COOKIE"]), "secret names are lower-case, at most 128 "
         "characters; for the key JD_COOKIE give --secret jd_cookie"),
        (lambda: bodies.secret_refs(["Db.Pass"]), "give --secret db.pass"),
        (lambda: bodies.load_revision_file("[1]", source="stdin"), "stdin is not a JSON object"),
        (lambda: bodies.load_revision_file("{", source="r.json"), "r.json is not JSON"),
        # Python's json reads them; JSON has no NaN or infinity, and the body could not be
        # sent (it was said as "the server's answer is not what this client expects").
        (lambda: bodies.load_revision_file('{"timeout_seconds": NaN}', source="r.json"),
         r"r.json is not JSON \(NaN is not a JSON number\)"),
        (lambda: bodies.load_revision_file('{"retry": {"factor": -Infinity}}', source="-"),
         r"- is not JSON \(-Infinity is not a JSON number\)"),
        (lambda: bodies.load_revision_file('{"retry": {"factor": 1e999}}', source="stdin"),
         r"stdin is not JSON \(1e999 is out of range\)"),
    ],
)
def test_what_cannot_be_sent_is_a_usage_error(build: object, message: str) -> None:
    with pytest.raises(ClientError, match=message) as caught:
        build()  # type: ignore[operator]
    assert caught.value.exit_code == EXIT_USAGE


def test_retention_flags_change_only_the_fields_they_name() -> None:
    stored = {"keep_runs": 5, "keep_days": None, "keep_rows": 50, "task_log_bytes": None}
    assert bodies.retention_body(stored, {"keep_days": 7, "keep_rows": None}, clear=False) == {
        "keep_runs": 5, "keep_days": 7, "keep_rows": None, "task_log_bytes": None,
    }  # fmt: skip
    assert bodies.retention_body(stored, {"keep_runs": 1}, clear=True) == {
        "keep_runs": 1, "keep_days": None, "keep_rows": None, "task_log_bytes": None,
    }  # fmt: skip
    assert bodies.retention_value("default") is None and bodies.retention_value("0") == 0
    with pytest.raises(ValueError):
        bodies.retention_value("-1")


def _recording_main(
    monkeypatch: pytest.MonkeyPatch, answers: dict[tuple[str, str], httpx.Response], *args: str
) -> tuple[int, list[tuple[str, str, object]]]:
    import app.cli.client as commands

    seen: list[tuple[str, str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, request.url.path, body))
        return answers[(request.method, request.url.path)]

    def client(url: str, token: str) -> Client:
        return Client(url, token, transport=httpx.MockTransport(answer))

    monkeypatch.setattr(commands, "Client", client)
    return main(list(args)), seen


REV = {"task": "t", "revision": 3, "digest": "sha256:ab", "argv": ["/bin/true"]}


def test_a_run_an_idempotency_key_made_before_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """200, not 201: the key's first run, which may have ended long ago; printed as a new one,
    it read as a run just started."""
    flags = ["--url", "http://api.test", "--token", "ql_t", "--idempotency-key", "k1"]
    said = []
    for status in (201, 200):
        answers = {
            ("POST", "/api/v1/runs"): httpx.Response(status, json=RUN),
            ("POST", "/api/v1/runs/01a2-old/rerun"): httpx.Response(status, json=RUN),
        }
        code, _ = _recording_main(monkeypatch, answers, "runs", "start", "hello", *flags)
        assert code == 0
        code, _ = _recording_main(monkeypatch, answers, "runs", "rerun", "01a2-old", *flags)
        assert code == 0
        said.append(capsys.readouterr().out.splitlines())
    assert said[0] == [
        "run 01a2-run failed (task hello revision 2)",
        "run 01a2-run failed (rerun of 01a2-old, task hello revision 2)",
    ]
    replay = "; made before with this idempotency key, no new run)"
    assert said[1] == [
        "run 01a2-run failed (task hello revision 2" + replay,
        "run 01a2-run failed (rerun of 01a2-old, task hello revision 2" + replay,
    ]


def test_tasks_put_takes_the_next_number_unless_the_latest_has_the_same_content(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = "/api/v1/tasks/t"
    flags = ["tasks", "put", "t", "--url", "http://api.test", "--token", "ql_t", "--secret", "pw"]
    conflict = httpx.Response(409, json={"code": "REVISION_CONFLICT", "detail": "other body"})
    answers = {
        ("POST", "/api/v1/recipes"): httpx.Response(
            201, json={"id": "localctx:sha256:1", "env": {}, "secrets": {"PW": "pw"}}
        ),
        ("GET", base): httpx.Response(200, json={"task": "t", "latest_revision": 2}),
        ("PUT", f"{base}/revisions/2"): conflict,
        ("PUT", f"{base}/revisions/3"): httpx.Response(201, json=REV),
        ("GET", "/api/v1/secrets"): httpx.Response(200, json={"items": [], "next_cursor": None}),
    }
    code, seen = _recording_main(monkeypatch, answers, *flags, "--", "/bin/true", "--", "-x")
    assert code == 0
    revision = {"argv": ["/bin/true", "--", "-x"], "recipe": "localctx:sha256:1"}
    assert seen == [
        ("POST", "/api/v1/recipes", {"env": {}, "secrets": {"PW": "pw"}}),
        ("GET", base, None),
        ("PUT", f"{base}/revisions/2", revision),
        ("PUT", f"{base}/revisions/3", revision),
        ("GET", "/api/v1/secrets", None),  # is the named secret set? (a warning if not)
    ]
    out, err = capsys.readouterr()
    assert out.splitlines() == ["recipe localctx:sha256:1 (PW)", "task t revision 3 created: sha256:ab"]
    assert err.splitlines() == [
        "warning: secret pw is not set yet; its runs fail SECRET_NOT_FOUND until "
        "`qinglong secrets set pw`"
    ]
    # The latest has the same content: 200, nothing new. The secret is set now: no warning.
    answers[("PUT", f"{base}/revisions/2")] = httpx.Response(200, json=REV | {"revision": 2})
    answers[("GET", "/api/v1/secrets")] = httpx.Response(
        200, json={"items": [{"name": "pw", "updated_at_ms": 1}], "next_cursor": None}
    )
    code, seen = _recording_main(monkeypatch, answers, *flags, "--", "/bin/true")
    assert code == 0 and [s[1] for s in seen][-2] == f"{base}/revisions/2"
    out, err = capsys.readouterr()
    assert "revision 2 unchanged" in out and err == ""
    # A new task starts at 1; a token that may not list secrets gets no check and no warning.
    answers[("GET", base)] = httpx.Response(404, json={"code": "TASK_NOT_FOUND", "detail": "x"})
    answers[("PUT", f"{base}/revisions/1")] = httpx.Response(201, json=REV | {"revision": 1})
    answers[("GET", "/api/v1/secrets")] = httpx.Response(403, json={"code": "FORBIDDEN", "detail": "x"})
    code, seen = _recording_main(monkeypatch, answers, *flags, "--", "/bin/true")
    assert code == 0 and [s[1] for s in seen][-3:-1] == [base, f"{base}/revisions/1"]
    assert capsys.readouterr().err == ""


def test_argv_after_double_dash_is_refused_by_commands_without_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["runs", "list", "--", "x"])
    assert caught.value.code == EXIT_USAGE
    assert "qinglong runs list: error: unrecognized arguments: -- x" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "list", "--bogus"],
        ["runs", "logs", "r", "--attempt", "0"],
        ["runs", "logs", "r", "--attempt", "x"],
        ["token", "list", "-x"],
        ["--data-dir", "runs", "token", "list", "-x"],  # "runs" is the dir, not the command
        ["tasks", "put", "t", "--retry-factor", "nan", "--", "/bin/true"],
        ["tasks", "put", "t", "--retry-delay", "inf", "--", "/bin/true"],
    ],
)
def test_a_bad_option_gets_the_usage_of_its_own_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    words = argv[2:] if argv[0] == "--data-dir" else argv
    command = f"qinglong {words[0]} {words[1]}"
    assert err.startswith(f"usage: {command} ") and f"\n{command}: error: " in err, err
    assert "_attempt_number" not in err  # a value that is not a number is said in words
    assert "_finite" not in err and ("finite number" in err) is ("put" in argv)


def test_logs_with_a_run_points_to_runs_logs(capsys: pytest.CaptureFixture[str]) -> None:
    """``qinglong logs RUN`` is a natural guess; it answered only "(choose from 'audit')"."""
    with pytest.raises(SystemExit) as caught:
        main(["logs", "01a2-run"])
    assert caught.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "a run's log: qinglong runs logs RUN" in err and "invalid choice: '01a2-run'" in err
    with pytest.raises(SystemExit):
        main(["logs", "audit", "--bogus"])
    assert "qinglong logs audit: error: unrecognized arguments: --bogus" in capsys.readouterr().err


def test_a_client_command_refuses_a_data_dir_it_would_ignore(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--data-dir", "/srv/other", "runs", "list"])
    assert caught.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: qinglong runs list ") and "give --url (or QL_URL)" in err


@pytest.mark.parametrize(
    "argv",
    [["schedules", "list", "--data-dir", "/srv/q"], ["runs", "list", "--data-dir=/srv/q"],
     ["tasks", "put", "t", "--data-dir", "/srv/q", "--", "/bin/true"]],
)  # fmt: skip
def test_a_data_dir_after_a_client_command_is_refused_with_the_same_reason(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    # Given after the command, as `qinglong token bootstrap --data-dir DIR` takes it, it was
    # argparse's "unrecognized arguments: --data-dir /srv/q", with no word of --url.
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"usage: qinglong {argv[0]} {argv[1]} ") and err.endswith(
        "error: --data-dir is for the service's own commands; this one talks to an api: give "
        "--url (or QL_URL)\n"
    ), err


def test_schedules_put_help_says_what_each_policy_flag_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # --overlap, --catchup and --catchup-window had no help at all: a crontab user could not
    # tell that the window bounds --catchup latest only.
    with pytest.raises(SystemExit):
        main(["schedules", "put", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for words in (
        "--overlap {skip,allow,queue_one,replace} a slot while a run of the schedule has not",
        "--catchup {latest,all,none} slots missed while down or paused:",
        "--catchup-window SECONDS under --catchup latest: the newest missed slot runs only if",
        "--max-concurrent N runs at once under --overlap allow (default 1)",
    ):
        assert words in shown, words


def test_lease_history_limit_that_is_not_a_number_is_said_without_a_function_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It read "argument --limit: invalid _limit value: 'abc'".
    with pytest.raises(SystemExit) as caught:
        main(["lease", "history", "--limit", "abc"])
    assert caught.value.code == EXIT_USAGE
    assert capsys.readouterr().err.endswith(
        "error: argument --limit: a whole number 1..1000 is required, not 'abc'\n"
    )


def test_a_schedule_revision_that_is_not_a_number_says_latest_is_one_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["schedules", "put", "s", "--task", "t", "--every", "60", "--revision", "abc"])
    assert caught.value.code == EXIT_USAGE
    assert "argument --revision: a revision number, or latest" in capsys.readouterr().err


def test_the_new_blocks_say_rerun_pin_retry_and_sizes_in_words() -> None:
    run = RUN | {"pinned": True, "trigger": {"kind": "manual", "rerun_of": "01a2-old"}}
    text = render.run_fields(run, tz=UTC)
    assert "rerun of: 01a2-old" in text and "pinned:   yes" in text
    retry = {"max_attempts": 3, "initial_delay_seconds": 10.0, "factor": 2.0,
             "max_delay_seconds": 600.0, "jitter": False, "on": ["failed", "lost"]}  # fmt: skip
    assert render.retry_policy(retry) == (
        "3 attempts on failed, lost; waits 10s x2 up to 600s"
    )
    assert render.retry_policy(None) == "-" == render.retry_policy({"max_attempts": 1})
    assert render.size(512) == "512 bytes" and render.size(1536) == "1.5 KiB (1536 bytes)"
    storage = {"retention_enabled": False, "log_bytes": 0, "free_bytes": None, "last_sweep": None}
    text = render.storage_fields(storage)
    assert "retention:    off" in text and "free:         -" in text and "none yet" in text
    sweep = {"at_ms": 0, "duration_ms": 4, "expired_logs": 1, "deleted_runs": 0,
             "freed_bytes": 10}  # fmt: skip
    hosts = [sweep | {"host": "h2", "instance_id": "i2"}, sweep | {"host": None, "instance_id": "i1"}]
    text = render.storage_fields(storage | {"last_sweep": hosts[0], "sweeps": hosts}, tz=UTC)
    assert "sweep of h2: 1970-01-01 00:00:00 in 4 ms: 1 log expired, 0 runs deleted" in " ".join(
        text.split()
    )  # one of a count is not "1 logs" (a panel-user walk-through)
    assert "sweep of i1:" in text and "last sweep" not in text  # each host, the stopped one too
    one = render.storage_fields(storage | {"last_sweep": hosts[0], "sweeps": hosts[:1]}, tz=UTC)
    assert "(host h2)" in one and "last sweep" in one
    policy = {"task": "t", "override": {"keep_runs": 2},
              "effective": {"keep_runs": 2, "keep_days": 30, "keep_rows": 9}}  # fmt: skip
    events = [{"seq": 1, "type": "attempt.failed", "at_ms": 0, "data": {"exit_code": 3}}]
    assert render.events_table(events, tz=UTC).splitlines()[1].split() == [
        "1", "1970-01-01", "00:00:00", "attempt.failed", "exit_code=3",
    ]  # fmt: skip
    # An instant reads as a time, not 13 digits; nulls say nothing; a span stays a number.
    waits = {"attempt": 2, "not_before_ms": 1_796_601_785_065, "signal": None, "delay_ms": 2000}
    events = [{"seq": 2, "type": "run.retry_scheduled", "at_ms": 0, "data": waits}]
    assert render.events_table(events, tz=UTC).splitlines()[1].split()[4:] == [
        "attempt=2", "not_before=2026-12-07T00:03:05", "delay_ms=2000",
    ]  # fmt: skip
    rows = [line.split() for line in render.retention_table(policy).splitlines()[2:]]
    assert rows == [["keep-runs", "2", "2"], ["keep-days", "global", "30"],
                    ["keep-rows", "global", "9"], ["task-log-bytes", "global", "no", "limit"]]  # fmt: skip
    sized = policy | {"effective": policy["effective"] | {"task_log_bytes": 1 << 30}}
    last = render.retention_table(sized).splitlines()[-1].split()
    assert last == ["task-log-bytes", "global", "1.0", "GiB", "(1073741824", "bytes)"]


def test_a_server_that_cannot_be_reached_is_told_with_what_to_check() -> None:
    from app.cli.client.api import _transport_message

    refused = httpx.ConnectError("[Errno 111] Connection refused")
    assert _transport_message("http://u:pw@h:1", refused) == (
        "cannot reach http://h:1: [Errno 111] Connection refused; is the service running "
        "there (qinglong serve), and is --url (QL_URL) its address?"
    )
    tls = httpx.ConnectError("[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)")
    assert _transport_message("https://h:1", tls) == (
        "cannot reach https://h:1: it does not speak TLS; try http:// in --url"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["runs", "list"], "no runs yet"),
        (["runs", "list", "--status", "failed"], "no runs match these filters"),
        (["schedules", "list", "--cursor", "c"], "no more schedules"),
        (["runs", "events", "r1"], "no events yet"),
    ],
)
def test_an_empty_listing_says_so_on_stderr_and_keeps_its_header_on_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    empty = httpx.Response(200, json={"items": [], "next_cursor": None})
    path = {"runs": "/api/v1/runs", "schedules": "/api/v1/schedules"}[args[0]]
    if args[1] == "events":
        path = "/api/v1/runs/r1/events"
    flags = ["--url", "http://api.test", "--token", "ql_t"]
    code, _ = _recording_main(monkeypatch, {("GET", path): empty}, *args, *flags)
    out, err = capsys.readouterr()
    assert code == 0 and out.split()[0] in ("RUN", "SCHEDULE", "SEQ", "ID"), out
    assert err.strip() == said


def test_a_schedule_body_is_the_file_then_the_flags_and_one_cadence() -> None:
    shown = {"name": "n", "version": 3, "created_at_ms": 1, "updated_at_ms": 2, "next_fires": [],
             "task": "t", "cron": ["0 3 * * *"], "every_seconds": None, "timezone": "UTC"}  # fmt: skip
    base = bodies.load_schedule_file(json.dumps(shown), source="s.json")
    assert set(base) == {"task", "cron", "every_seconds", "timezone"}  # output-only fields gone
    every = bodies.schedule_body(base, {"every_seconds": 60, "timezone": "Asia/Shanghai"})
    assert every == {"task": "t", "every_seconds": 60, "timezone": "Asia/Shanghai"}
    cron = bodies.schedule_body(every, {"cron": ["*/5 * * * *"], "paused": True})
    assert cron == {"task": "t", "cron": ["*/5 * * * *"], "timezone": "Asia/Shanghai",
                    "paused": True}  # fmt: skip
    with pytest.raises(ClientError, match="not both") as both:
        bodies.schedule_body(None, {"task": "t", "cron": ["* * * * *"], "every_seconds": 5})
    with pytest.raises(ClientError, match="needs --task and --cron") as bare:
        bodies.schedule_body(None, {"task": "t"})
    assert both.value.exit_code == bare.value.exit_code == EXIT_USAGE


def test_schedules_put_revision_latest_drops_the_pin_a_shown_file_carries() -> None:
    """What ``schedules show --json`` printed of a pinned schedule carries its revision; a
    ``--revision latest`` put drops it (the api's absent: the task's latest), a number pins."""
    from app.cli import build_parser

    parse_args = build_parser().parse_args
    args = parse_args(["schedules", "put", "n", "--file", "s.json", "--revision", "latest"])
    pinned = {"task": "t", "revision": 2, "cron": ["0 3 * * *"]}
    assert bodies.schedule_body(pinned, vars(args)) == {"task": "t", "cron": ["0 3 * * *"]}
    args = parse_args(["schedules", "put", "n", "--task", "t", "--every", "60", "--revision", "3"])
    assert bodies.schedule_body(None, vars(args))["revision"] == 3
    # A file's own "latest" is the file's word, sent as is for the api to refuse.
    spelled = {"task": "t", "revision": "latest", "cron": ["0 3 * * *"]}
    assert bodies.schedule_body(spelled, {})["revision"] == "latest"
    for bad in ("0", "newest"):
        with pytest.raises(SystemExit):
            parse_args(["schedules", "put", "n", "--revision", bad])


def test_schedules_put_if_version_sends_the_stored_etag_and_a_412_says_nothing_was_saved(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.cli.client as commands

    path = "/api/v1/schedules/nightly"
    stored = {"name": "nightly", "task": "t", "every_seconds": 60, "version": 2}
    put_answer = httpx.Response(412, json={"code": "PRECONDITION_FAILED", "detail": "stale"})
    if_match: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == path
        if request.method == "GET":
            return httpx.Response(200, json=stored, headers={"ETag": '"s1.2"'})
        if_match.append(request.headers.get("if-match"))
        return put_answer  # changed between the read and the PUT

    transport = httpx.MockTransport(answer)
    monkeypatch.setattr(commands, "Client", lambda url, token: Client(url, token, transport=transport))
    flags = ["--url", "http://api.test", "--token", "ql_t", "--task", "t", "--every", "60"]
    assert main(["schedules", "put", "nightly", *flags, "--if-version", "2"]) == 3
    assert if_match == ['"s1.2"']
    assert capsys.readouterr().err == (
        "error: 412 PRECONDITION_FAILED: stale; nothing was saved: "
        "see qinglong schedules show nightly\n"
    )
    # Another version than the stored one: refused before any PUT.
    assert main(["schedules", "put", "nightly", *flags, "--if-version", "1"]) == 3
    assert if_match == ['"s1.2"']
    assert "it is at version 2, not 1; nothing was saved" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["schedules", "put", "nightly", *flags, "--if-version", "0"])
    assert usage.value.code == 2 and "versions are numbered from 1" in capsys.readouterr().err


def test_max_concurrent_warns_under_a_policy_it_does_not_act_under() -> None:
    said = bodies.max_concurrent_warning({"max_concurrent": 3})
    assert said is not None and "acts under --overlap allow only; under --overlap skip" in said
    assert bodies.max_concurrent_warning({"max_concurrent": 3, "overlap": "allow"}) is None
    assert bodies.max_concurrent_warning({"overlap": "replace"}) is None


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"catchup": "all"}, "--overlap skip, so only the oldest missed slot runs"),
        ({"catchup": "all", "overlap": "queue_one"}, "only the two oldest missed slots run"),
        ({"catchup": "all", "overlap": "replace"}, "only the newest slot runs"),
        ({"catchup": "all", "overlap": "allow"}, "--overlap allow --max-concurrent 1, so only"),
        ({"catchup": "all", "overlap": "allow", "max_concurrent": 5}, None),
        ({"catchup": "latest"}, None),
        ({}, None),
    ],
)
def test_catchup_all_warns_when_the_overlap_policy_keeps_one_run(
    body: dict[str, object], said: str | None
) -> None:
    warning = bodies.catchup_all_warning(body)
    if said is None:
        assert warning is None
    else:
        assert warning is not None and said in warning and "docs/schedules.md §3" in warning


def test_runs_logs_of_a_retry_that_never_started_points_at_the_attempt_before(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    waiting = {"number": 2, "status": "cancelled", "started_at_ms": None, "log": {"bytes": 0}}
    run = RUN | {"id": "r1", "status": "cancelled", "latest_attempt": waiting}
    answers = {
        ("GET", "/api/v1/runs/r1"): httpx.Response(200, json=run),
        ("GET", "/api/v1/runs/r1/attempts/2/log"): httpx.Response(200, content=b""),
        ("GET", "/api/v1/runs/r1/attempts/1/log"): httpx.Response(200, content=b"boom\n"),
        ("GET", "/api/v1/runs/r1/attempts"): httpx.Response(200, json={"items": [
            {"number": 1, "started_at_ms": 1_000}, {"number": 2, "started_at_ms": None},
        ], "next_cursor": None}),
    }  # fmt: skip
    flags = ["--url", "http://api.test", "--token", "ql_t"]
    code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *flags)
    out, err = capsys.readouterr()
    assert (code, out) == (0, "")
    assert err == (
        "attempt 2 has not started, so it has no output; the last that ran: "
        "qinglong runs logs r1 --attempt 1\n"
    )
    # Requeued before anything ran (the worker was unavailable): no attempt to point at.
    answers[("GET", "/api/v1/runs/r1/attempts")] = httpx.Response(200, json={"items": [
        {"number": 1, "started_at_ms": None}, {"number": 2, "started_at_ms": None},
    ]})  # fmt: skip
    _recording_main(monkeypatch, answers, "runs", "logs", "r1", *flags)
    assert capsys.readouterr().err.endswith("no output; none of its attempts has started yet\n")
    code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", "--attempt", "1", *flags)
    assert (code, capsys.readouterr()) == (0, ("boom\n", ""))


def test_runs_logs_of_an_attempt_that_never_started_says_so_and_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = {"number": 1, "status": "failed", "started_at_ms": None, "finished_at_ms": 5,
               "error_code": "SECRET_NOT_FOUND", "log": {"bytes": 0}}  # fmt: skip
    run = RUN | {"id": "r1", "status": "failed", "latest_attempt": refused}
    answers = {
        ("GET", "/api/v1/runs/r1"): httpx.Response(200, json=run),
        ("GET", "/api/v1/runs/r1/attempts/1/log"): httpx.Response(200, content=b""),
    }
    flags = ["--url", "http://api.test", "--token", "ql_t"]
    for extra in ([], ["--attempt", "1"]):
        code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *extra, *flags)
        assert (code, capsys.readouterr()) == (0, ("", (
            "attempt 1 never started (SECRET_NOT_FOUND), so it has no output; "
            "why: qinglong runs show r1\n"
        )))  # fmt: skip
    # Queued, not launched yet: no ending to name.
    waiting = refused | {"status": "claimed", "finished_at_ms": None, "error_code": None}
    answers[("GET", "/api/v1/runs/r1")] = httpx.Response(200, json=run | {"latest_attempt": waiting})
    code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *flags)
    said = capsys.readouterr().err
    assert (code, said) == (0, "attempt 1 has not started yet, so it has no output\n")
    # A job that ran and printed nothing: nothing is said.
    ran = refused | {"status": "succeeded", "started_at_ms": 4, "error_code": None}
    answers[("GET", "/api/v1/runs/r1")] = httpx.Response(200, json=run | {"latest_attempt": ran})
    code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *flags)
    assert (code, capsys.readouterr()) == (0, ("", ""))


def test_a_retry_past_its_instant_is_due_not_waiting() -> None:
    waiting = {"number": 2, "status": "claimed", "exit_code": None, "signal": None,
               "error_code": None, "started_at_ms": None, "finished_at_ms": None, "log": {}}  # fmt: skip
    run = RUN | {"status": "queued", "latest_attempt": waiting, "next_attempt_at_ms": 1_000}
    assert "attempt:  2 waiting: a retry, due since 1970-01-01 00:00:01" in render.run_fields(run, tz=UTC)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("UNAUTHENTICATED", 401), ("FORBIDDEN", 403), ("LOG_EXPIRED", 410), ("LOG_MISSING", 410),
        ("RUN_NOT_FOUND", 404), ("DATABASE_UNREACHABLE", 503), ("STORAGE_UNAVAILABLE", 503),
    ],
)
def test_a_follow_ended_by_the_server_says_the_status_its_refusal_has(code: str, status: int) -> None:
    from app.cli.client.api import ApiProblem, _follow_item

    with pytest.raises(ApiProblem) as ended:
        _follow_item("error", json.dumps({"code": code, "detail": "why"}), None)
    assert ended.value.status == status
    assert str(ended.value.message) == f"{status} {code}: why (the log follow was ended)"


def test_runs_events_shows_a_whole_history_in_one_page_by_default() -> None:
    """20 a page cut a run of three attempts before its ending (new-user walk-through)."""
    from app.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["runs", "events", "R"]).limit == 200
    assert parser.parse_args(["runs", "list"]).limit == 20


# A job's output: colours, then an OSC 52 (set the clipboard), a clear-screen, a C1 CSI, a NUL.
HOSTILE = "\x1b[31mred\x1b[0m\t1\r2\n\x1b]52;c;ZXZpbA==\x07\x1b[2J\x9b6n\x00end\n"
SHOWN = "\x1b[31mred\x1b[0m\t1\r2\n\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\x9b6n\\x00end\n"


def test_a_jobs_output_on_a_terminal_keeps_its_colours_and_shows_every_other_control() -> None:
    assert render.terminal_text(HOSTILE) == SHOWN
    # Chunk by chunk, wherever a chunk ends: a colour split in two still passes whole.
    for cut in range(1, len(HOSTILE)):
        screen = render.TerminalText()
        assert screen.feed(HOSTILE[:cut]) + screen.feed(HOSTILE[cut:]) + screen.end() == SHOWN
    # An ESC at the very end is held, then shown once nothing can complete it.
    screen = render.TerminalText()
    assert (screen.feed("a\x1b"), screen.end()) == ("a", "\\x1b")
    # grep's and gcc's colours erase to the line's end (ESC [ K): that passes, no other erase.
    grep = "\x1b[01;31m\x1b[Kerror\x1b[m\x1b[K"
    assert render.terminal_text(grep + "\x1b[3K\x1b[2J") == grep + "\\x1b[3K\\x1b[2J"
    # A 24-bit foreground and background colour, cut anywhere across two chunks.
    wide = "\x1b[38;2;255;255;255;48;2;10;20;30mok"
    for cut in range(1, len(wide)):
        screen = render.TerminalText()
        assert screen.feed(wide[:cut]) + screen.feed(wide[cut:]) + screen.end() == wide


class _Terminal(io.TextIOWrapper):
    def __init__(self, encoding: str = "utf-8") -> None:
        super().__init__(io.BytesIO(), encoding=encoding, newline="")

    def isatty(self) -> bool:
        return True

    def written(self) -> bytes:
        self.flush()
        return cast(io.BytesIO, self.buffer).getvalue()


def _ended_log(chunks: list[str], *, follow: bool) -> dict[tuple[str, str], httpx.Response]:
    """Answers for run r1, succeeded, whose attempt 1 wrote ``chunks``: as a follow's SSE
    events (one a chunk) or, without --follow, as the log's bytes."""
    done = RUN | {"id": "r1", "status": "succeeded"}
    done["latest_attempt"] = RUN["latest_attempt"] | {"status": "succeeded", "exit_code": 0}  # type: ignore[operator]
    raw = "".join(chunks).encode()
    if follow:
        events, offset = [], 0
        for chunk in chunks:
            events.append(_chunk(offset, chunk))
            offset += len(chunk.encode())
        end = f"event: end\ndata: {json.dumps({'status': 'succeeded', 'bytes': len(raw)})}\n\n"
        log = httpx.Response(200, content=_sse(*events, end))
    else:
        log = httpx.Response(200, content=raw)
    return {
        ("GET", "/api/v1/runs/r1"): httpx.Response(200, json=done),
        ("GET", "/api/v1/runs/r1/attempts/1/log"): log,
    }


@pytest.mark.parametrize("follow", [False, True])
def test_runs_logs_on_a_terminal_shows_escapes_unless_raw(
    monkeypatch: pytest.MonkeyPatch, follow: bool
) -> None:
    # Followed, the same output in two chunks, cut inside the first colour.
    answers = _ended_log([HOSTILE[:3], HOSTILE[3:]], follow=follow)
    flags = ["--url", "http://api.test", "--token", "ql_t"] + (["--follow"] if follow else [])
    for extra, expected in (([], SHOWN.encode()), (["--raw"], HOSTILE.encode())):
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stdout", terminal)
        code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *extra, *flags)
        assert (code, terminal.written()) == (0, expected)


@pytest.mark.parametrize("follow", [False, True])
def test_a_log_a_terminal_cannot_encode_is_shown_with_replacements_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, follow: bool
) -> None:
    answers = _ended_log(["中文 ok\n"], follow=follow)
    flags = ["--url", "http://api.test", "--token", "ql_t"] + (["--follow"] if follow else [])
    for extra in ([], ["--raw"]):
        if extra and not follow:
            continue  # without --follow, --raw writes the bytes as they are
        terminal = _Terminal("latin-1")
        monkeypatch.setattr(sys, "stdout", terminal)
        code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *extra, *flags)
        assert (code, terminal.written()) == (0, b"?? ok\n")


def test_a_secret_value_that_is_not_utf8_is_refused_as_such_not_blamed_on_the_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `qinglong secrets set key < key.bin`: the locale reads the bytes as surrogates, which
    # the JSON body could not carry.
    stdin = io.TextIOWrapper(io.BytesIO(b"\xff\xfe\x00k"), errors="surrogateescape")
    monkeypatch.setattr(sys, "stdin", stdin)
    sent = httpx.Response(500, json={"detail": "a request was sent"})
    assert _main_against(monkeypatch, sent, "secrets", "set", "key") == EXIT_USAGE
    assert capsys.readouterr().err == (
        "error: the value on stdin is not UTF-8 text, and a secret is text: give a binary one "
        "as base64 (base64 -w0 FILE | qinglong secrets set key); nothing was set\n"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (  # `tasks put old -- /bin/ls /mnt/<a GBK file name>` in a UTF-8 locale
            ["tasks", "put", "old", "--revision", "1", "--", "/bin/ls", "/mnt/\udcc4\udce3"],
            "error: an argument holds bytes that are not UTF-8 text (b'\\xc4\\xe3'); "
            "the api takes UTF-8 only",
        ),
        (
            ["runs", "show", "\udcff"],
            "error: an argument holds bytes that are not UTF-8 text (b'\\xff'); "
            "the api takes UTF-8 only",
        ),
        (
            ["runs", "start", "backup", "--idempotency-key", "nächtlich"],
            "error: a header value holds '\\xe4': --idempotency-key takes ASCII characters only",
        ),
    ],
)
def test_an_argument_the_request_cannot_carry_is_named_not_blamed_on_the_server(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    line: str,
) -> None:
    import app.cli.client as commands

    sent = httpx.MockTransport(lambda _: httpx.Response(500, json={"detail": "a request was sent"}))
    monkeypatch.setattr(commands, "Client", lambda url, token: Client(url, token, transport=sent))
    monkeypatch.setenv("QL_URL", "http://api.test")  # not flags: after `--` they are the job's
    monkeypatch.setenv("QL_TOKEN", "ql_t")
    assert main(args) == EXIT_USAGE
    assert capsys.readouterr().err == line + "\n"


def test_what_the_terminal_cannot_hold_is_shown_as_a_question_mark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    latin1 = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(latin1, encoding="latin-1"))
    listed = httpx.Response(
        200, json={"items": [{"task": "café-备份", "latest_revision": 2}], "next_cursor": None}
    )
    assert _main_against(monkeypatch, listed, "tasks", "list") == 0
    assert latin1.getvalue().decode("latin-1").splitlines()[1].split() == ["café-??", "2"]


@pytest.mark.parametrize("follow", [False, True])
def test_a_log_cut_at_its_quota_says_so_after_its_last_byte(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], follow: bool
) -> None:
    # Its last line, cut in the middle, would read as the job's own end.
    answers = _ended_log(["line 1\nline 2 is cu"], follow=follow)
    flags = ["--url", "http://api.test", "--token", "ql_t"] + (["--follow"] if follow else [])
    code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *flags)
    out, err = capsys.readouterr()
    assert (code, out) == (0, "line 1\nline 2 is cu")
    assert "log truncated at 10 bytes: 7 more bytes dropped (quota)\n" in err
    # A whole log: nothing is said.
    whole = _ended_log(["line 1\n"], follow=follow)
    done = whole[("GET", "/api/v1/runs/r1")].json()
    done["latest_attempt"]["log"] = {"bytes": 7, "truncated": False}
    whole[("GET", "/api/v1/runs/r1")] = httpx.Response(200, json=done)
    _recording_main(monkeypatch, whole, "runs", "logs", "r1", *flags)
    assert "truncated" not in capsys.readouterr().err


@pytest.mark.parametrize("follow", [False, True])
def test_a_log_that_kept_its_tail_says_where_the_gap_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], follow: bool
) -> None:
    # Over its quota the log keeps its head and its last bytes: the gap is inside it.
    answers = _ended_log(["line 1\nli" + "ne 9\n"], follow=follow)
    ended = answers[("GET", "/api/v1/runs/r1")].json()
    ended["latest_attempt"]["log"] |= {"bytes": 14, "dropped_at": 9}
    answers[("GET", "/api/v1/runs/r1")] = httpx.Response(200, json=ended)
    flags = ["--url", "http://api.test", "--token", "ql_t"] + (["--follow"] if follow else [])
    code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *flags)
    out, err = capsys.readouterr()
    assert (code, out) == (0, "line 1\nline 9\n")
    assert (
        "log truncated: 7 bytes dropped at byte 9 (quota); the last 5 bytes are the output's end\n"
    ) in err
    shown = RUN | {"latest_attempt": RUN["latest_attempt"] | {"log": ended["latest_attempt"]["log"]}}
    assert (
        "log:      14 bytes, truncated (7 bytes dropped at byte 9: quota; the last 5 bytes "
        "are the output's end)"
    ) in render.run_fields(shown, tz=UTC)


def test_a_running_log_past_its_head_says_what_it_keeps_not_that_0_bytes_were_dropped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # While the job runs the api says truncated once the head is full; the count, the
    # reason and the gap come when it ends.
    answers = _ended_log(["line 1\nline 2\n"], follow=False)
    running = answers[("GET", "/api/v1/runs/r1")].json() | {"status": "running"}
    log = {"bytes": 14, "truncated": True, "dropped_bytes": 0, "truncation_reason": None}
    running["latest_attempt"] |= {"status": "running", "exit_code": None, "log": log}
    answers[("GET", "/api/v1/runs/r1")] = httpx.Response(200, json=running)
    flags = ["--url", "http://api.test", "--token", "ql_t"]
    code, _ = _recording_main(monkeypatch, answers, "runs", "logs", "r1", *flags)
    out, err = capsys.readouterr()
    assert (code, out) == (0, "line 1\nline 2\n")
    assert err == (
        "log holds the output's first 14 bytes: of the output past them only the last bytes "
        "are kept, added when the job ends\n"
    )
    assert (
        "log:      14 bytes, the output's first: of the output past them only the last bytes "
        "are kept, added when the job ends"
    ) in render.run_fields(running, tz=UTC)


def test_runs_list_of_a_task_that_does_not_exist_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def problem(status: int, code: str) -> httpx.Response:
        return httpx.Response(status, json={"status": status, "code": code, "detail": "no"})

    empty = httpx.Response(200, json={"items": [], "next_cursor": None})
    answers = {
        ("GET", "/api/v1/runs"): empty,
        ("GET", "/api/v1/tasks/bakcup"): problem(404, "TASK_NOT_FOUND"),
    }
    flags = ["--url", "http://api.test", "--token", "ql_t"]
    code, _ = _recording_main(monkeypatch, answers, "runs", "list", "--task", "bakcup", *flags)
    assert (code, capsys.readouterr().err) == (
        0, "no runs match these filters: no task is named bakcup (qinglong tasks list)\n"
    )
    # A task that exists, or a token that may not read tasks: only the filters are named.
    for answer in (httpx.Response(200, json={"task": "bakcup"}), problem(403, "FORBIDDEN")):
        answers[("GET", "/api/v1/tasks/bakcup")] = answer
        _recording_main(monkeypatch, answers, "runs", "list", "--task", "bakcup", *flags)
        assert capsys.readouterr().err == "no runs match these filters\n"


def test_a_follow_says_how_an_attempt_ended_and_until_when_its_retry_waits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import app.cli.client as commands

    def end(status: str, size: int) -> str:
        return f"event: end\ndata: {json.dumps({'status': status, 'bytes': size})}\n\n"

    first = {"number": 1, "status": "failed", "exit_code": 4, "log": {"bytes": 7}}
    second = {"number": 2, "status": "claimed", "exit_code": None, "log": {"bytes": 0}}
    waiting = RUN | {"id": "r1", "status": "queued", "latest_attempt": second,
                     "next_attempt_at_ms": 4_102_444_800_000}  # fmt: skip
    done = RUN | {"id": "r1", "status": "failed", "latest_attempt": second | {
        "status": "failed", "exit_code": 4, "log": {"bytes": 7, "truncated": False}}}  # fmt: skip
    reads = iter([waiting, waiting, done])  # the start, after attempt 1, after attempt 2
    answers = {
        "/api/v1/runs": httpx.Response(201, json=waiting | {"latest_attempt": first | {
            "status": "claimed", "exit_code": None}}),
        "/api/v1/runs/r1/attempts/1/log": httpx.Response(
            200, content=_sse(_chunk(0, "trying\n"), end("failed", 7))),
        "/api/v1/runs/r1/attempts/2/log": httpx.Response(
            200, content=_sse(_chunk(0, "trying\n"), end("failed", 7))),
        "/api/v1/runs/r1/attempts": httpx.Response(
            200, json={"items": [first, second], "next_cursor": None}),
    }  # fmt: skip

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/runs/r1":
            return httpx.Response(200, json=next(reads))
        return answers[request.url.path]

    transport = httpx.MockTransport(answer)
    monkeypatch.setattr(commands, "Client", lambda url, token: Client(url, token, transport=transport))
    flags = ["--url", "http://api.test", "--token", "ql_t"]
    assert main(["runs", "start", "hello", "--follow", *flags]) == 1
    out, err = capsys.readouterr()
    assert out == "trying\ntrying\n"
    assert (
        "attempt 1 ended failed (exit 4); following attempt 2, a retry that waits until "
        f"{render.when(4_102_444_800_000)}\n"
    ) in err


def test_a_route_the_api_lacks_asks_whether_the_url_is_the_service_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import app.cli.client as commands

    problem = {"status": 404, "code": "NOT_FOUND", "detail": "no such resource"}
    no_route = httpx.MockTransport(lambda _: httpx.Response(404, json=problem))
    monkeypatch.setattr(commands, "Client", lambda url, token: Client(url, token, transport=no_route))
    monkeypatch.setenv("QL_CLIENT_CONFIG", str(tmp_path / "client.toml"))
    said = (
        "error: 404 NOT_FOUND: no such resource under http://nas:8000/api/v1: is that the "
        "service's root url (without /api/v1), and a qinglong api of this version?\n"
    )
    url = ["--url", "http://me:pw@nas:8000/api/v1", "--token", "ql_" + "A" * 43]
    assert main(["runs", "list", *url]) == 3
    assert capsys.readouterr().err == said
    assert main(["login", *url]) == 3
    assert capsys.readouterr().err == said
    assert not (tmp_path / "client.toml").exists()


def test_ca_certificates_that_cannot_be_loaded_are_named_as_such(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # httpx loads them as the client is made, before any request, for an http:// url too.
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-ca.pem"))
    assert main(["runs", "list", "--url", "http://api.test", "--token", "ql_t"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        "error: cannot load the CA certificates of SSL_CERT_FILE or SSL_CERT_DIR: "
        "[Errno 2] No such file or directory\n"
    )


def test_json_on_an_output_that_is_not_utf8_escapes_what_it_cannot_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    latin1 = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(latin1, encoding="latin-1"))
    page = {"items": [{"task": "café-备份", "latest_revision": 2}], "next_cursor": None}
    listed = httpx.Response(200, json=page)
    assert _main_against(monkeypatch, listed, "tasks", "list", "--json") == 0
    assert json.loads(latin1.getvalue().decode("latin-1")) == page  # not "caf?-??"


def test_an_interval_schedule_in_a_zone_with_summer_time_is_warned_in_winter_too() -> None:
    """A daily slot made in a London winter falls at 00:00 there now and at 01:00 all
    summer: the warning looked at the next fire's offset only."""
    winter = {"every_seconds": 86400, "timezone": "Europe/London",
              "next_fires": [{"local": "2026-12-08T00:00:00+00:00"}]}  # fmt: skip
    said = bodies.every_zone_warning(winter)
    assert said is not None and "00:00:00 there now, and elsewhere on the clock" in said, said
    utc = winter | {"timezone": "Etc/UTC"}
    assert bodies.every_zone_warning(utc) is None  # no season moves it
    hourly = winter | {"every_seconds": 3600}
    assert bodies.every_zone_warning(hourly) is None  # a whole hour: every slot on the hour


@pytest.mark.parametrize(
    ("every", "local", "where"),
    [(86400, "2026-12-09T05:30:00+05:30", "its slots fall at 05:30:00 there"),
     (43200, "2026-12-08T17:30:00+05:30", "its slots fall at 05:30:00 and 17:30:00 there"),
     (7200, "2026-12-08T09:30:00+05:30", "its slots fall at 01:30:00, 03:30:00, ... 23:30:00")],
)  # fmt: skip
def test_the_every_warning_says_where_every_slot_falls_not_only_the_next(
    every: int, local: str, where: str
) -> None:
    # `--every 7200 --timezone Europe/Berlin` said "its slots fall at 03:00:00 there", the next
    # slot's time, as if that were the only one (they fall at 01:00, 03:00, ... 23:00).
    fires = [{"local": local}]
    said = bodies.every_zone_warning(
        {"every_seconds": every, "timezone": "Asia/Kolkata", "next_fires": fires}
    )
    assert said is not None and f"Asia/Kolkata: {where}" in said, said


@pytest.mark.parametrize("every", [7, 90000, 2147483647])
def test_an_interval_no_day_holds_whole_is_not_warned_of_in_any_zone(every: int) -> None:
    # Its slots move on every clock from one day to the next, UTC's too: "its slots fall at
    # 11:14:07 there" (--every 2147483647 in Asia/Shanghai) named a time none but the next has.
    fires = [{"local": "2026-12-08T07:02:19+05:45"}]
    schedule = {"every_seconds": every, "timezone": "Asia/Kathmandu", "next_fires": fires}
    assert bodies.every_zone_warning(schedule) is None


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local zone is Europe/Berlin (CET/CEST) for the test."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_when_of_runs_list_is_one_of_its_forms_in_local_time_or_refused(berlin: None) -> None:
    now = 1_796_612_400_000  # 2026-12-07T03:00:00Z, 04:00 in Berlin
    forms = {  # what a user types; all but an instant sent in UTC
        "2h": ("2026-12-07T01:00:00Z", now - 7_200_000),
        "90s": ("2026-12-07T02:58:30Z", now - 90_000),
        "2026-12-07": ("2026-12-06T23:00:00Z", now - 4 * 3_600_000),
        "2026-07-01 18:30": ("2026-07-01T16:30:00Z", 1_782_923_400_000),
        "2026-07-01T18:30:15": ("2026-07-01T16:30:15Z", 1_782_923_415_000),
        "2026-12-07T03:00:00.25Z": ("2026-12-07T03:00:00.25Z", now + 250),
        "2026-12-07T11:00:00+08:00": ("2026-12-07T11:00:00+08:00", now),
        "2026-12-07T03:00:00.1234567891Z": ("2026-12-07T03:00:00.1234567891Z", now + 123),
        "2026-12-31T23:59:60Z": ("2026-12-31T23:59:60Z", 1_798_761_599_999),  # a leap second
        "36500d": ("1927-01-01T03:00:00Z", now - 36_500 * 86_400_000),
        "0001-01-02": ("0001-01-01T23:06:32Z", -62_135_513_608_000),  # LMT +00:53:28
    }
    for text, expected in forms.items():
        assert bodies.instant(text, flag="--since", now_ms=now) == expected, text
    # 02:30 on the last Sunday of March does not exist there, and of October comes twice.
    for skipped_or_twice in ("2026-03-29 02:30", "2026-10-25T02:30"):
        with pytest.raises(ClientError, match="a clock change skips or repeats") as refused:
            bodies.instant(skipped_or_twice, flag="--until", now_ms=now)
        assert refused.value.exit_code == 2
    for nonsense in ("yesterday", "2026-12-07 3:00", "2026-02-30", "-2h", "2 h", "1w",
                     "2026-12-07T03:00:00+25:00", "2026-12-07T03:00:00-00:60"):  # fmt: skip
        with pytest.raises(ClientError, match=r"not a time; give 2h, 30m, 1d"):
            bodies.instant(nonsense, flag="--since", now_ms=now)
    for too_long_ago in ("36501d", "9999999d", "99999999d", "9" * 5000 + "s"):
        with pytest.raises(ClientError, match=r": at most 36500d ago \(100 years\)$"):
            bodies.instant(too_long_ago, flag="--since", now_ms=now)
    for edge in ("0001-01-01", "9999-12-31 12:00"):  # either side of the years 1 to 9999 in UTC
        with pytest.raises(ClientError, match=r"out of range: give a local date or time from "):
            bodies.instant(edge, flag="--since", now_ms=now)


@pytest.mark.parametrize("zone", ["Europe/Amsterdam", "Africa/Monrovia"])
def test_a_local_when_is_sent_in_utc_where_the_zones_offset_has_seconds(
    monkeypatch: pytest.MonkeyPatch, zone: str
) -> None:
    """Amsterdam kept +00:19:32 until 1937, Monrovia -00:44:30 until 1972: RFC 3339 has no
    seconds in an offset, so an instant sent with one was a 422 (exit 3)."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        now = 1_796_612_400_000
        for text in ("36500d", "1970-01-01", "1930-06-01 12:00"):
            sent, at_ms = bodies.instant(text, flag="--since", now_ms=now)
            assert sent.endswith("Z") and validation.parse_instant(sent, field="since") == at_ms
    finally:
        monkeypatch.undo()
        time.tzset()




def test_system_token_says_the_tokens_name_scopes_and_expiry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a token may do, asked of the server (a 403 elsewhere names one scope only)."""
    body = {"name": "ci\x1b[2J", "scopes": ["logs:read", "runs:read"], "expires_at_ms": 0}
    answers = {("GET", "/api/v1/token"): httpx.Response(200, json=body)}
    code, _ = _recording_main(
        monkeypatch, answers, "system", "token", "--url", "http://t", "--token", "ql_" + "A" * 43
    )
    out = capsys.readouterr().out
    assert code == 0 and "scopes:  logs:read runs:read" in out, out
    assert "\x1b" not in out and "1970-01-01" in out  # a name is shown safe; the expiry a time
    answers[("GET", "/api/v1/token")] = httpx.Response(200, json=body | {"expires_at_ms": None})
    code, _ = _recording_main(
        monkeypatch, answers, "system", "token", "--url", "http://t", "--token", "ql_" + "A" * 43
    )
    assert "expires: never (until revoked)" in capsys.readouterr().out


def test_system_ready_says_how_the_job_process_limit_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``/readyz``'s ``process_limit`` (docs/job-user.md) is a second line of ``system
    ready``; an older worker's answer (null) or another shape adds none."""
    from app.worker.process_limit import HELD_BY

    assert {*render._HELD_BY, "off"} == set(HELD_BY)  # a word for each way it can hold
    checks = {"database": "ok", "disk": "ok", "worker": "ok"}
    said = {
        None: None,
        "odd": None,
        json.dumps({"max_processes": 4096, "held_by": "pids_max"}):
            "process limit: 4096 per job, by its cgroup's pids.max",
        json.dumps({"max_processes": 10, "held_by": "none"}):
            "process limit: 10 set but not enforced here (docs/job-user.md)",
        json.dumps({"max_processes": None, "held_by": "off"}):
            "process limit: off (QL_JOB_MAX_PROCESSES=off)",
        json.dumps({"max_processes": 10, "held_by": "newer"}): None,
    }  # fmt: skip
    for limit, line in said.items():
        body = {"status": "ready", "checks": checks, "isolation": "same_user",
                "process_limit": limit if limit in (None, "odd") else json.loads(limit)}  # fmt: skip
        answers = {("GET", "/readyz"): httpx.Response(200, json=body)}
        code, _ = _recording_main(monkeypatch, answers, "system", "ready", "--url", "http://t")
        out = capsys.readouterr().out.splitlines()
        assert code == 0 and out[0] == "ready: database ok, disk ok, worker ok", out
        assert out[1:] == ([] if line is None else [line]), (limit, out)
