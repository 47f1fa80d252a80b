"""Client commands of ``qinglong`` over the public REST API (docs/cli.md).

``runs``, ``tasks``, ``schedules``, ``secrets list|set|delete``, ``login`` and ``logout``
talk to a running service over HTTP only (never to its database): the same contract as any
other client (docs/api.md). The import contract "the cli client talks HTTP only"
(pyproject.toml) holds that.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO
from urllib.parse import quote

from app.cli.client import render
from app.cli.client.api import (
    EXIT_API_ERROR,
    EXIT_OK,
    EXIT_RUN_NOT_SUCCEEDED,
    EXIT_USAGE,
    ApiProblem,
    Client,
    ClientError,
    LogChunk,
    public_url,
)
from app.cli.client.config import (
    DEFAULT_URL,
    check_token,
    config_path,
    read_config,
    resolve,
    write_config,
)

# docs/api.md §6.
RUN_STATUSES = (
    "queued",
    "dispatching",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
    "lost",
)
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})
POLL_S = 0.25
EXIT_BROKEN_PIPE = 141

Command = Callable[[Client, argparse.Namespace], int]


SECRET_ACTIONS = frozenset({"list", "set", "delete"})


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", help=f"the api's base url (default $QL_URL, the config file, {DEFAULT_URL})"
    )
    common.add_argument("--token", help="API token (default $QL_TOKEN, then the config file)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    return common


def register(sub: Any, *, with_secrets: bool = False) -> None:
    """Add ``runs``, ``tasks``, ``schedules``, ``login`` and ``logout`` to the parser.

    ``with_secrets``: also a ``secrets`` command with the client's actions only (the full
    parser's ``secrets`` is app/cli/secrets.py's, which adds them beside ``rotate-key``).
    """
    common = _common()

    runs = sub.add_parser("runs", help="start, list, show, follow and cancel runs (over HTTP)")
    rsub = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)
    start = rsub.add_parser("start", parents=[common], help="enqueue a run of TASK")
    start.add_argument("task")
    start.add_argument("--revision", type=int, help="the revision (default: the latest)")
    start.add_argument("--priority", type=int, help="the priority (default: the revision's)")
    start.add_argument("--idempotency-key", help="the same key and body return the first run")
    start.add_argument(
        "--follow", "-f", action="store_true", help="stream the log, end with the run's status"
    )
    start.set_defaults(handler=_client(cmd_runs_start))
    lst = rsub.add_parser("list", parents=[common], help="runs, newest first")
    lst.add_argument("--task", help="only runs of this task")
    lst.add_argument("--status", choices=RUN_STATUSES, help="only runs with this status")
    _paging(lst)
    lst.set_defaults(handler=_client(cmd_runs_list))
    show = rsub.add_parser("show", parents=[common], help="one run and its attempts")
    show.add_argument("run")
    show.set_defaults(handler=_client(cmd_runs_show))
    logs = rsub.add_parser("logs", parents=[common], help="a run's log (the latest attempt's)")
    logs.add_argument("run")
    logs.add_argument("--attempt", type=int, help="this attempt number (default: the latest)")
    logs.add_argument(
        "--follow", "-f", action="store_true", help="stream the log, end with the run's status"
    )
    logs.set_defaults(handler=_client(cmd_runs_logs))
    cancel = rsub.add_parser("cancel", parents=[common], help="request that a run stops")
    cancel.add_argument("run")
    cancel.set_defaults(handler=_client(cmd_runs_cancel))

    tasks = sub.add_parser("tasks", help="list and show tasks (over HTTP)")
    tsub = tasks.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    tlist = tsub.add_parser("list", parents=[common], help="tasks and their latest revision")
    _paging(tlist)
    tlist.set_defaults(handler=_client(cmd_tasks_list))
    tshow = tsub.add_parser("show", parents=[common], help="a task's latest revision")
    tshow.add_argument("task")
    tshow.set_defaults(handler=_client(cmd_tasks_show))

    schedules = sub.add_parser("schedules", help="list, show, pause and resume schedules")
    ssub = schedules.add_subparsers(dest="schedules_command", metavar="ACTION", required=True)
    slist = ssub.add_parser("list", parents=[common], help="schedules by name")
    _paging(slist)
    slist.set_defaults(handler=_client(cmd_schedules_list))
    for action, what in (
        ("show", "one schedule and its next fire times"),
        ("pause", "stop deciding a schedule's slots"),
        ("resume", "decide a schedule's slots again (catch-up covers the pause)"),
    ):
        one = ssub.add_parser(action, parents=[common], help=what)
        one.add_argument("name")
        one.set_defaults(handler=_client(cmd_schedule_one), schedule_action=action)

    login = sub.add_parser(
        "login", parents=[common], help="check a token and save it with the url (0600 file)"
    )
    login.set_defaults(handler=cmd_login)
    logout = sub.add_parser("logout", help="delete the client config file")
    logout.set_defaults(handler=cmd_logout)
    if with_secrets:
        secrets = sub.add_parser("secrets", help="list, set and delete secrets (over HTTP)")
        register_secret_actions(
            secrets.add_subparsers(dest="secrets_command", metavar="ACTION", required=True)
        )


def register_secret_actions(ssub: Any) -> None:
    """Add ``secrets list|set|delete`` (over HTTP; values are write-only) to ``ssub``."""
    common = _common()
    slist = ssub.add_parser("list", parents=[common], help="secret names and update times")
    _paging(slist)
    slist.set_defaults(handler=_client(cmd_secrets_list))
    sset = ssub.add_parser(
        "set", parents=[common], help="set or replace a secret; the value is read from stdin"
    )
    sset.add_argument("name")
    sset.set_defaults(handler=_client(cmd_secrets_set))
    sdel = ssub.add_parser("delete", parents=[common], help="delete a secret")
    sdel.add_argument("name")
    sdel.set_defaults(handler=_client(cmd_secrets_delete))


def _paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=_limit, default=20, help="items per page (1..200)")
    parser.add_argument("--cursor", help="the next page (printed after a full page)")


def _limit(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 200:
        raise argparse.ArgumentTypeError("must be 1..200")
    return value


def _client(command: Command) -> Callable[[argparse.Namespace], int]:
    """The handler: resolve the target, run ``command``, one line for every problem."""

    def handler(args: argparse.Namespace) -> int:
        try:
            target = resolve(args.url, args.token)
            with Client(target.url, target.token) as client:
                return command(client, args)
        except ClientError as exc:
            return _fail(exc)
        except BrokenPipeError:
            _quiet_stdout()
            return EXIT_BROKEN_PIPE
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # A 2xx whose JSON lacks what docs/api.md promises: another server, or another
            # version of it. One line, not a traceback.
            return _fail(
                ClientError(
                    "the server's answer is not what this client expects "
                    f"({type(exc).__name__}); is --url a qinglong api of this version?",
                    EXIT_API_ERROR,
                )
            )

    return handler


def _fail(exc: ClientError) -> int:
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    print(f"error: {exc.message}", file=sys.stderr)
    return exc.exit_code


def _quiet_stdout() -> None:
    # The reader went away (``| head``): drop what is buffered instead of failing at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _emit_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, ensure_ascii=False))


def _more(args: argparse.Namespace, page: Mapping[str, Any], command: str) -> None:
    cursor = page.get("next_cursor")
    if cursor and not args.json:
        print(f"more: qinglong {command} --cursor {cursor}", file=sys.stderr)


# -- runs ------------------------------------------------------------------------------------


def cmd_runs_start(client: Client, args: argparse.Namespace) -> int:
    """Enqueue a run; with --follow stream its log and exit by its status."""
    body: dict[str, Any] = {"task": args.task}
    if args.revision is not None:
        body["revision"] = args.revision
    if args.priority is not None:
        body["priority"] = args.priority
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    run = client.post("/runs", body, headers=headers)
    if not args.follow:
        if args.json:
            _emit_json(run)
        else:
            print(
                f"run {run['id']} {run['status']} (task {render.safe(run['task'])} "
                f"revision {run['revision']})"
            )
        return EXIT_OK
    print(
        f"run {run['id']} {run['status']} (task {render.safe(run['task'])} "
        f"revision {run['revision']})",
        file=sys.stderr,
    )
    return _follow_and_report(client, run, attempt=None, as_json=args.json)


def cmd_runs_list(client: Client, args: argparse.Namespace) -> int:
    """One page of runs, newest first."""
    page = client.get(
        "/runs", task=args.task, status=args.status, limit=args.limit, cursor=args.cursor
    )
    if args.json:
        _emit_json(page)
        return EXIT_OK
    print(render.runs_table(page["items"]))
    filters = "".join(
        f" --{name} {value}"
        for name, value in (("task", args.task), ("status", args.status))
        if value
    )
    _more(args, page, f"runs list{filters} --limit {args.limit}")
    return EXIT_OK


def cmd_runs_show(client: Client, args: argparse.Namespace) -> int:
    """One run; in tables also its attempts."""
    run = client.get(f"/runs/{_seg(args.run)}")
    if args.json:
        _emit_json(run)
        return EXIT_OK
    print(render.run_fields(run))
    attempts = client.get(f"/runs/{_seg(args.run)}/attempts")["items"]
    if len(attempts) > 1:
        print()
        print(render.attempts_table(attempts))
    return EXIT_OK


def cmd_runs_logs(client: Client, args: argparse.Namespace) -> int:
    """The log of the run's latest (or the given) attempt; --follow streams it."""
    run = client.get(f"/runs/{_seg(args.run)}")
    if args.follow:
        return _follow_and_report(client, run, attempt=args.attempt, as_json=args.json)
    number = args.attempt or (run.get("latest_attempt") or {}).get("number")
    if number is None:
        raise ClientError(f"run {args.run} has no attempt yet", EXIT_USAGE)
    data = client.log_bytes(run["id"], number)
    if args.json:
        text = data.decode("utf-8", errors="replace")
        _emit_json({"run": run["id"], "attempt": number, "text": text})
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return EXIT_OK


def cmd_runs_cancel(client: Client, args: argparse.Namespace) -> int:
    """Record a cancel intent; prints the run's status now."""
    run = client.post(f"/runs/{_seg(args.run)}/cancel")
    if args.json:
        _emit_json(run)
    elif run["status"] == "cancelled":
        print(f"run {run['id']} cancelled")
    else:
        print(f"cancel requested: run {run['id']} is {run['status']} until the worker stops it")
    return EXIT_OK


def _follow_and_report(
    client: Client, run: dict[str, Any], *, attempt: int | None, as_json: bool
) -> int:
    """Follow, print the final status line (and with --json the run); the exit code."""
    log_out = sys.stderr if as_json else sys.stdout
    try:
        run, ended = _follow(client, run, log_out=log_out, only=attempt)
    except KeyboardInterrupt:
        log_out.flush()
        print(
            f"\nstopped following; run {run['id']} goes on "
            f"(`qinglong runs cancel {run['id']}` stops it)",
            file=sys.stderr,
        )
        return 130
    if as_json:
        _emit_json(run)
    outcome = render.attempt_outcome(run.get("latest_attempt"))
    detail = "" if outcome == "-" else f" ({outcome})"
    print(f"run {run['id']} {ended}{detail}", file=sys.stderr)
    return EXIT_OK if ended == "succeeded" else EXIT_RUN_NOT_SUCCEEDED


def _follow(
    client: Client, run: dict[str, Any], *, log_out: TextIO, only: int | None
) -> tuple[dict[str, Any], str]:
    """Stream each attempt's log in turn until the run ends; ``(run, final status)``.

    A requeued run (docs/backlog-requeue.md) gets a new attempt: its log follows the first
    one's. ``only``: follow that attempt and end with its status.
    """
    run_id = run["id"]
    number = only or (run.get("latest_attempt") or {}).get("number") or 1
    tail = "\n"
    while True:
        status = ""
        for item in client.follow(run_id, number):
            if isinstance(item, LogChunk):
                if item.text:
                    log_out.write(item.text)
                    log_out.flush()
                    tail = item.text[-1]
            else:
                status = item.status
        if tail != "\n" and log_out.isatty():
            log_out.write("\n")
            tail = "\n"
        while True:
            run = client.get(f"/runs/{_seg(run_id)}")
            if only is not None:
                return run, status
            if run["status"] in TERMINAL:
                return run, str(run["status"])
            latest = (run.get("latest_attempt") or {}).get("number") or number
            if latest != number:
                print(
                    f"attempt {number} ended {status}; following attempt {latest}",
                    file=sys.stderr,
                )
                number = latest
                break
            time.sleep(POLL_S)


# -- tasks -----------------------------------------------------------------------------------


def cmd_tasks_list(client: Client, args: argparse.Namespace) -> int:
    """One page of tasks."""
    page = client.get("/tasks", limit=args.limit, cursor=args.cursor)
    if args.json:
        _emit_json(page)
        return EXIT_OK
    print(render.tasks_table(page["items"]))
    _more(args, page, f"tasks list --limit {args.limit}")
    return EXIT_OK


def cmd_tasks_show(client: Client, args: argparse.Namespace) -> int:
    """A task with its latest revision."""
    task = client.get(f"/tasks/{_seg(args.task)}")
    if args.json:
        _emit_json(task)
    else:
        print(render.task_fields(task))
    return EXIT_OK


# -- schedules -------------------------------------------------------------------------------


def cmd_schedules_list(client: Client, args: argparse.Namespace) -> int:
    """One page of schedules."""
    page = client.get("/schedules", limit=args.limit, cursor=args.cursor)
    if args.json:
        _emit_json(page)
        return EXIT_OK
    print(render.schedules_table(page["items"]))
    _more(args, page, f"schedules list --limit {args.limit}")
    return EXIT_OK


def cmd_schedule_one(client: Client, args: argparse.Namespace) -> int:
    """``show``, ``pause`` or ``resume`` one schedule."""
    action = args.schedule_action
    path = f"/schedules/{_seg(args.name)}"
    schedule = client.get(path) if action == "show" else client.post(f"{path}/{action}")
    if args.json:
        _emit_json(schedule)
    elif action == "show":
        print(render.schedule_fields(schedule))
    else:
        state = "paused" if schedule.get("paused") else "active"
        print(f"schedule {render.safe(schedule['name'])} is {state}")
    return EXIT_OK


# -- secrets (write-only values, docs/api.md §5) ---------------------------------------------


def cmd_secrets_list(client: Client, args: argparse.Namespace) -> int:
    """One page of secret names (never values)."""
    page = client.get("/secrets", limit=args.limit, cursor=args.cursor)
    if args.json:
        _emit_json(page)
        return EXIT_OK
    rows = [(s["name"], render.when(s.get("updated_at_ms"))) for s in page["items"]]
    print(render.table(("SECRET", "UPDATED"), rows))
    _more(args, page, f"secrets list --limit {args.limit}")
    return EXIT_OK


def cmd_secrets_set(client: Client, args: argparse.Namespace) -> int:
    """PUT a secret's value, read from the terminal without echo or from stdin (never argv)."""
    if sys.stdin.isatty():
        value = getpass.getpass(f"value of {args.name}: ")
    else:
        value = sys.stdin.read().removesuffix("\n")
    if not value:
        raise ClientError("an empty secret value; nothing was set", EXIT_USAGE)
    client.request("PUT", f"/api/v1/secrets/{_seg(args.name)}", body={"value": value})
    if args.json:
        _emit_json({"name": args.name, "set": True})
    else:
        print(f"secret {render.safe(args.name)} set")
    return EXIT_OK


def cmd_secrets_delete(client: Client, args: argparse.Namespace) -> int:
    """DELETE a secret."""
    client.request("DELETE", f"/api/v1/secrets/{_seg(args.name)}")
    if args.json:
        _emit_json({"name": args.name, "deleted": True})
    else:
        print(f"secret {render.safe(args.name)} deleted")
    return EXIT_OK


# -- login / logout --------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    """Check a token against the api and save it with the url to the config file."""
    path = config_path()
    try:
        stored = read_config(path)
        url = args.url or _env("QL_URL") or stored.get("url") or DEFAULT_URL
        token = check_token(args.token or _env("QL_TOKEN") or _read_token())
        with Client(url, token) as client:
            try:
                client.get("/runs", limit=1)
            except ApiProblem as exc:
                if exc.status != 403:  # a token without runs:read is still a token
                    raise
        write_config(path, url=url, token=token)
    except ClientError as exc:
        return _fail(exc)
    except OSError as exc:
        print(f"error: cannot write {path}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    print(f"saved the token for {public_url(url)} to {path} (mode 0600)")
    return EXIT_OK


def cmd_logout(args: argparse.Namespace) -> int:
    """Delete the config file (the token stays valid until `qinglong token revoke`)."""
    path = config_path()
    try:
        path.unlink()
    except FileNotFoundError:
        print(f"no config file at {path}")
        return EXIT_OK
    except OSError as exc:
        print(f"error: cannot remove {path}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    print(f"removed {path}")
    return EXIT_OK


def _read_token() -> str:
    if sys.stdin.isatty():
        return getpass.getpass("API token: ").strip()
    return sys.stdin.readline().strip()


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _seg(value: str) -> str:
    return quote(value, safe="")
