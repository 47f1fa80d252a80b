"""Client commands of ``qinglong`` over the public REST API (docs/cli.md).

``runs``, ``tasks``, ``schedules``, ``system``, ``secrets list|set|delete``, ``login`` and
``logout`` talk to a running service over HTTP only (never to its database): the same
contract as any other client (docs/api.md). The import contract "the cli client talks HTTP
only" (pyproject.toml) holds that.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import getpass
import io
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO, TextIO

from app.cli.client import bodies, render
from app.cli.client.api import (
    EXIT_API_ERROR,
    EXIT_OK,
    EXIT_RUN_NOT_SUCCEEDED,
    EXIT_USAGE,
    ApiProblem,
    Client,
    ClientError,
    LogChunk,
    path_segment,
    public_url,
)
from app.cli.client.config import (
    DEFAULT_URL,
    ConfigRefused,
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
TERMINAL = render.ENDED
POLL_S = 0.25
EXIT_BROKEN_PIPE = 141
EXIT_OUTPUT_FAILED = 74  # sysexits' EX_IOERR, as the service's 75 and 76 are theirs

Command = Callable[[Client, argparse.Namespace], int]


SECRET_ACTIONS = frozenset({"list", "set", "delete"})
# A retention flag not given (``--keep-runs default`` is None: the global value).
_UNSET: Any = object()


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", help=f"the api's base url (default $QL_URL, the config file, {DEFAULT_URL})"
    )
    common.add_argument("--token", help="API token (default $QL_TOKEN, then the config file)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    return common


def _log_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--follow", "-f", action="store_true", help="stream the log, end with the run's status"
    )
    parser.add_argument(
        "--raw",
        action="store_true",
        help="write the job's output as it is, on a terminal too (there, by default, only "
        "colours pass: other escape sequences and control characters show as \\xNN)",
    )


def register(sub: Any, *, with_secrets: bool = False) -> None:
    """Add ``runs``, ``tasks``, ``schedules``, ``login`` and ``logout`` to the parser.

    ``with_secrets``: also a ``secrets`` command with the client's actions only (the full
    parser's ``secrets`` is app/cli/secrets.py's, which adds them beside ``rotate-key``).
    """
    common = _common()

    runs = sub.add_parser(
        "runs", help="start, list, show, follow, cancel, rerun and pin runs (over HTTP)"
    )
    rsub = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)
    start = rsub.add_parser("start", parents=[common], help="enqueue a run of TASK")
    start.add_argument("task")
    start.add_argument("--revision", type=int, help="the revision (default: the latest)")
    start.add_argument("--priority", type=int, help="the priority (default: the revision's)")
    start.add_argument("--idempotency-key", help="the same key and body return the first run")
    _log_flags(start)
    start.set_defaults(handler=_client(cmd_runs_start))
    lst = rsub.add_parser("list", parents=[common], help="runs, newest first")
    lst.add_argument("--task", help="only runs of this task")
    lst.add_argument("--status", choices=RUN_STATUSES, help="only runs with this status")
    lst.add_argument("--schedule", help="only runs this schedule started (its name)")
    lst.add_argument(
        "--since", metavar="WHEN",
        help="only runs created at or after WHEN: 2h, 30m, 1d (ago), 2026-12-07 or "
        "'2026-12-07 03:00' (local time), or 2026-12-07T03:00:00+08:00",
    )  # fmt: skip
    lst.add_argument(
        "--until", metavar="WHEN", help="only runs created before WHEN (the forms of --since)"
    )
    _paging(lst)
    lst.set_defaults(handler=_client(cmd_runs_list))
    show = rsub.add_parser("show", parents=[common], help="one run and its attempts")
    show.add_argument("run")
    show.set_defaults(handler=_client(cmd_runs_show))
    logs = rsub.add_parser("logs", parents=[common], help="a run's log (the latest attempt's)")
    logs.add_argument("run")
    logs.add_argument(
        "--attempt", type=_attempt_number, help="this attempt number, from 1 (default: the latest)"
    )
    _log_flags(logs)
    logs.set_defaults(handler=_client(cmd_runs_logs))
    cancel = rsub.add_parser("cancel", parents=[common], help="request that a run stops")
    cancel.add_argument("run")
    cancel.set_defaults(handler=_client(cmd_runs_cancel))
    events = rsub.add_parser("events", parents=[common], help="a run's events in order")
    events.add_argument("run")
    # A run's history in one page: 20 cut a run of three attempts before its ending.
    _paging(events, default=200)
    events.set_defaults(handler=_client(cmd_runs_events))
    rerun = rsub.add_parser(
        "rerun", parents=[common], help="a new run of the same revision and priority"
    )
    rerun.add_argument("run")
    rerun.add_argument("--idempotency-key", help="the same key returns the first rerun")
    _log_flags(rerun)
    rerun.set_defaults(handler=_client(cmd_runs_rerun))
    for action, what in (
        ("pin", "keep a run's log and rows against every retention policy"),
        ("unpin", "let retention treat a run like any other again"),
    ):
        one = rsub.add_parser(action, parents=[common], help=what)
        one.add_argument("run")
        one.set_defaults(handler=_client(cmd_runs_pin), pin_action=action)

    tasks = sub.add_parser(
        "tasks",
        help="list, show, put, archive and unarchive tasks; their revisions and retention "
        "(over HTTP)",
    )
    tsub = tasks.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    tlist = tsub.add_parser(
        "list", parents=[common], help="tasks and their latest revision (not archived ones)"
    )
    _paging(tlist)
    which = tlist.add_mutually_exclusive_group()
    which.add_argument(
        "--archived", dest="archived", action="store_const", const="only",
        help="archived tasks only",
    )  # fmt: skip
    which.add_argument(
        "--all", dest="archived", action="store_const", const="include",
        help="archived tasks too",
    )  # fmt: skip
    tlist.set_defaults(handler=_client(cmd_tasks_list))
    tshow = tsub.add_parser("show", parents=[common], help="a task's latest revision")
    tshow.add_argument("task")
    tshow.set_defaults(handler=_client(cmd_tasks_show))
    for action, what in (
        ("archive", "hide a task from tasks list and refuse new runs; its history stays"),
        ("unarchive", "list a task again and let runs start"),
    ):
        one = tsub.add_parser(action, parents=[common], help=what)
        one.add_argument("task")
        one.set_defaults(handler=_client(cmd_tasks_archive), archive_action=action)
    _register_tasks_put(tsub, common)
    trevs = tsub.add_parser("revisions", parents=[common], help="a task's revisions, newest first")
    trevs.add_argument("task")
    _paging(trevs)
    trevs.set_defaults(handler=_client(cmd_tasks_revisions))
    tret = tsub.add_parser(
        "retention", parents=[common], help="show a task's retention; with flags, change it"
    )
    tret.add_argument("task")
    for field, what in (
        ("keep_runs", "the newest runs that keep their logs"),
        ("keep_days", "runs younger than this many days keep their logs"),
        ("keep_rows", "the newest runs that keep their rows (more than --keep-runs)"),
        ("task_log_bytes", "log bytes the task may keep"),
    ):
        tret.add_argument(
            "--" + field.replace("_", "-"),
            dest=field,
            type=_retention_value,
            default=_UNSET,  # `default` gives None: the global value
            metavar="N|default",
            help=f"{what}; default: the global value",
        )
    tret.add_argument(
        "--clear", action="store_true", help="every field the global value (then the flags)"
    )
    tret.set_defaults(handler=_client(cmd_tasks_retention))

    system = sub.add_parser("system", help="readiness and storage figures (over HTTP)")
    ysub = system.add_subparsers(dest="system_command", metavar="ACTION", required=True)
    ready = ysub.add_parser(
        "ready", parents=[common], help="is the service ready (database, disk, worker)"
    )
    ready.set_defaults(handler=_client(cmd_system_ready, token_needed=False))
    storage = ysub.add_parser(
        "storage", parents=[common], help="log bytes, runs kept, free space (admin)"
    )
    storage.set_defaults(handler=_client(cmd_system_storage))
    me = ysub.add_parser(
        "token", parents=[common],
        help="the token this client sends: its name, scopes and expiry (any token)",
    )  # fmt: skip
    me.set_defaults(handler=_client(cmd_system_token))

    schedules = sub.add_parser(
        "schedules", help="list, show, pause, resume, put and delete schedules; their decisions"
    )
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
    decisions = ssub.add_parser(
        "decisions", parents=[common],
        help="what each slot became, newest first: fired, skipped_overlap, missed, ...",
    )  # fmt: skip
    decisions.add_argument("name")
    _paging(decisions)
    decisions.set_defaults(handler=_client(cmd_schedules_decisions))
    _register_schedules_put(ssub, common)
    sdel = ssub.add_parser(
        "delete", parents=[common], help="delete a schedule (its queued runs are cancelled)"
    )
    sdel.add_argument("name")
    sdel.set_defaults(handler=_client(cmd_schedules_delete))

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


def _register_schedules_put(ssub: Any, common: argparse.ArgumentParser) -> None:
    put = ssub.add_parser(
        "put",
        parents=[common],
        help="create or replace a schedule: from flags, or --file and flags",
        usage="qinglong schedules put NAME --task TASK (--cron EXPR | --every SECONDS) "
        "[flags] [--file PATH|-] [--if-version N]",
    )
    put.add_argument("name")
    put.add_argument(
        "--file", help="the schedule body as JSON (docs/api.md §9); - reads it from stdin"
    )
    put.add_argument("--task", help="the task it starts")
    put.add_argument(
        "--revision", type=_schedule_revision, metavar="N|latest",
        help="pin this revision; latest unpins one the file pins (default: the task's latest)",
    )  # fmt: skip
    put.add_argument(
        "--cron", action="append", metavar="EXPR",
        help="a cron expression, quoted ('0 3 * * *': 5 fields, or 6 with seconds first); "
        "repeatable, up to 8",
    )  # fmt: skip
    put.add_argument(
        "--every", type=int, dest="every_seconds", metavar="SECONDS",
        help="seconds between slots, 1 or more (slots aligned to the epoch)",
    )  # fmt: skip
    put.add_argument(
        "--timezone", metavar="ZONE",
        help="an IANA zone: --cron's times are read in it; --every's are only shown in it "
        "(default UTC)",
    )  # fmt: skip
    put.add_argument(
        "--overlap", choices=["skip", "allow", "queue_one", "replace"],
        help="a slot while a run of the schedule has not ended: skip it (default), allow up to "
        "--max-concurrent runs, queue_one (one waits), replace (cancel the older)",
    )  # fmt: skip
    put.add_argument(
        "--max-concurrent", type=int, metavar="N",
        help="runs at once under --overlap allow (default 1)",
    )
    put.add_argument(
        "--catchup", choices=["latest", "all", "none"],
        help="slots missed while down or paused: latest (default) runs the newest one, all "
        "decides each in order under --overlap (up to 100), none runs none",
    )  # fmt: skip
    put.add_argument(
        "--catchup-window", type=int, metavar="SECONDS",
        help="under --catchup latest: the newest missed slot runs only if at most this old "
        "(default 3600)",
    )  # fmt: skip
    put.add_argument(
        "--jitter", type=int, metavar="SECONDS",
        help="0..86400: each on-time slot waits up to this long, a delay fixed per slot "
        "(never past the next slot)",
    )  # fmt: skip
    put.add_argument(
        "--paused", action="store_true",
        help="store it paused; without it (and without paused in --file) it is active",
    )  # fmt: skip
    put.add_argument(
        "--if-version", type=_version_number, metavar="N",
        help="replace only version N of the stored schedule (refused if someone changed it)",
    )  # fmt: skip
    put.set_defaults(handler=_client(cmd_schedules_put))


def register_secret_actions(ssub: Any) -> None:
    """Add ``secrets list|set|delete`` (over HTTP; values are write-only) to ``ssub``."""
    common = _common()
    slist = ssub.add_parser("list", parents=[common], help="secret names and update times")
    _paging(slist)
    slist.set_defaults(handler=_client(cmd_secrets_list))
    sset = ssub.add_parser(
        "set", parents=[common], help="set or replace a secret; the value is read from stdin",
        description="Set or replace a secret. Its value is never an argument: at a terminal "
        "it is asked for without echo; otherwise it is read from stdin (one line end "
        "removed), e.g. printf %s \"$VALUE\" | qinglong secrets set NAME.",
    )  # fmt: skip
    sset.add_argument("name", help="lower-case letters, digits, '.', '_' and '-'")
    sset.set_defaults(handler=_client(cmd_secrets_set))
    sdel = ssub.add_parser("delete", parents=[common], help="delete a secret")
    sdel.add_argument("name")
    sdel.set_defaults(handler=_client(cmd_secrets_delete))


def _register_tasks_put(tsub: Any, common: argparse.ArgumentParser) -> None:
    put = tsub.add_parser(
        "put",
        parents=[common],
        help="add a revision of TASK: from --file, or from flags and the command after --",
        usage="qinglong tasks put TASK [--revision N] [--file PATH|-] [flags] [-- ARGV...]",
    )
    put.add_argument("task")
    put.add_argument(
        "--revision", type=int, help="this number (default: the latest + 1, or 1 for a new task)"
    )
    put.add_argument(
        "--file", help="the revision body as JSON (docs/api.md §4); - reads it from stdin"
    )
    put.add_argument("--cwd", help="the working directory (absolute)")
    put.add_argument("--timeout", type=int, metavar="SECONDS", help="1..604800")
    put.add_argument("--priority", type=int, help="-100..100 (default 0)")
    put.add_argument("--max-concurrent", type=int, help="runs of the task at once (1..1000)")
    put.add_argument("--leftovers", choices=("kill", "keep"), help="default kill")
    put.add_argument("--run-as", metavar="USER", help="a user of QL_JOB_USERS")
    put.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    put.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME|KEY=NAME",
        help="repeatable; the job gets the secret's value as KEY (NAME upper-cased, - and . "
        "as _); set values with `qinglong secrets set`",
    )
    put.add_argument("--retry-max-attempts", type=int, metavar="N", help="1..20 attempts in all")
    put.add_argument("--retry-delay", type=_finite, metavar="SECONDS", help="the first wait")
    put.add_argument("--retry-max-delay", type=_finite, metavar="SECONDS", help="the longest wait")
    put.add_argument("--retry-factor", type=_finite, help="each wait is the previous times this")
    put.add_argument(
        "--retry-on",
        action="append",
        choices=("failed", "timed_out", "lost"),
        help="repeatable; the endings that retry (default failed)",
    )
    jitter = put.add_mutually_exclusive_group()
    jitter.add_argument(
        "--retry-jitter", action="store_true",
        help="each wait drawn in the upper half of its backoff (default: exact waits)",
    )  # fmt: skip
    jitter.add_argument("--retry-no-jitter", action="store_true", help="exact waits")
    put.set_defaults(handler=_client(cmd_tasks_put), job_argv=[])


def _retention_value(text: str) -> int | None:
    try:
        return bodies.retention_value(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a whole number >= 0, or default") from None


def _url_and_maybe_token(args: argparse.Namespace) -> tuple[str, str]:
    """The url as usual; the token if one is given anywhere, else none (``/readyz``)."""
    try:
        target = resolve(args.url, args.token)
    except ConfigRefused:
        raise
    except ClientError:  # no token: fine for an unauthenticated endpoint
        stored = read_config(config_path())
        return args.url or _env("QL_URL") or stored.get("url") or DEFAULT_URL, ""
    return target.url, target.token


def _paging(parser: argparse.ArgumentParser, *, default: int = 20) -> None:
    parser.add_argument(
        "--limit", type=_limit, default=default, help=f"items per page (1..200, default {default})"
    )
    parser.add_argument("--cursor", help="the next page (printed after a full page)")


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a whole number is required") from None


def _finite(text: str) -> float:
    """A number of seconds or a factor: ``nan`` and ``inf`` read as floats but have no JSON
    form, and the api could only refuse a body that cannot be sent."""
    try:
        return bodies.finite_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a finite number is required") from None


def _schedule_revision(text: str) -> int | str:
    """``schedules put --revision``: a revision number, or ``latest`` (no pin)."""
    if text == "latest":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a revision number, or latest") from None
    if value < 1:
        raise argparse.ArgumentTypeError("revisions are numbered from 1, or latest")
    return value


def _attempt_number(text: str) -> int:
    value = _whole(text)
    if value < 1:  # attempts are numbered from 1; 0 would read as "the latest"
        raise argparse.ArgumentTypeError("attempts are numbered from 1")
    return value


def _version_number(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError("versions are numbered from 1")
    return value


def _limit(text: str) -> int:
    value = _whole(text)
    if not 1 <= value <= 200:
        raise argparse.ArgumentTypeError("must be 1..200")
    return value


def _client(command: Command, *, token_needed: bool = True) -> Callable[[argparse.Namespace], int]:
    """The handler: resolve the target, run ``command``, one line for every problem."""

    def handler(args: argparse.Namespace) -> int:
        token_from = url = ""
        if sys.stdout is None:
            # Started with its output closed (``>&-``): Python has no stdout at all. What
            # would be printed goes nowhere, as print() to None did, never a traceback.
            sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
        if isinstance(sys.stdout, io.TextIOWrapper):
            # What the output's encoding cannot hold is '?', as in a log (docs/cli.md §3): a
            # task's argv in Chinese on a Latin-1 terminal is no UnicodeEncodeError.
            sys.stdout.reconfigure(errors="replace")
        try:
            if token_needed:
                target = resolve(args.url, args.token)
                url, token, token_from = target.url, target.token, target.token_from
            else:
                url, token = _url_and_maybe_token(args)
            with Client(url, token) as client:
                code = command(client, args)
            # What print() buffered is written here, inside the handler: at the interpreter's
            # exit a reader gone (``| head``) would be "Exception ignored" and exit 120.
            sys.stdout.flush()
            return code
        except ApiProblem as exc:
            if exc.status == 401 and token_from:  # which token, and what to do about it
                exc = ApiProblem(
                    exc.status, exc.code,
                    f"{exc.message} (the token from {token_from}; "
                    "check it or run `qinglong login`)",
                )  # fmt: skip
            return _fail(_no_route(exc, url))
        except ClientError as exc:
            return _fail(exc)
        except BrokenPipeError:
            quiet_stdout()
            return EXIT_BROKEN_PIPE
        except OSError as exc:
            # Our output could not be written (`> file` on a full disk): what the client reads
            # itself (the config, --file, stdin, the CA certificates) turns its OSError into a
            # ClientError where it does.
            quiet_stdout()
            return _fail(
                ClientError(f"cannot write the output: {exc.strerror or exc}", EXIT_OUTPUT_FAILED)
            )
        except UnicodeEncodeError as exc:
            # Only the request is encoded strictly (the output replaces): it is the user's.
            return _fail(_unsendable(exc))
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


def _no_route(exc: ApiProblem, url: str) -> ApiProblem:
    """404 NOT_FOUND is a route the api lacks, and the client asks only for routes it has:
    the url is not the service's root (``--url http://nas:8000/api/v1``), or another version."""
    if exc.code != "NOT_FOUND":
        return exc
    return ApiProblem(
        exc.status, exc.code,
        f"{exc.message} under {public_url(url)}: is that the service's root url (without "
        "/api/v1), and a qinglong api of this version?",
    )  # fmt: skip


def _unsendable(exc: UnicodeEncodeError) -> ClientError:
    """Why a word of the command cannot go into the request, naming it (exit 2)."""
    part = exc.object[exc.start : exc.end]
    if exc.encoding == "ascii":  # an HTTP header: --idempotency-key
        return ClientError(
            f"a header value holds {part!a}: --idempotency-key takes ASCII characters only",
            EXIT_USAGE,
        )
    # The locale read bytes that are not UTF-8 as surrogates (a file name from an old NAS).
    raw = part.encode("utf-8", errors="surrogateescape")
    return ClientError(
        f"an argument holds bytes that are not UTF-8 text ({raw!r}); the api takes UTF-8 only",
        EXIT_USAGE,
    )


def _fail(exc: ClientError) -> int:
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    print(f"error: {exc.message}", file=sys.stderr)
    return exc.exit_code


def quiet_stdout() -> None:
    """The reader went away (``| head``): drop what is buffered instead of failing at exit
    (the service commands too, app/cli/__init__.py)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _emit_json(doc: Any) -> None:
    # Where the output is not UTF-8, JSON's own escapes keep every character (a table's '?'
    # would change the document a script reads).
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    print(json.dumps(doc, indent=2, ensure_ascii=codecs.lookup(encoding).name != "utf-8"))


def _listing(
    client: Client,
    args: argparse.Namespace,
    path: str,
    table: Callable[[list[Any]], str],
    command: str,
    unknown: Callable[[], str] = lambda: "",
    none_yet: Callable[[], str | None] = lambda: None,
    **filters: Any,
) -> int:
    """One page of a listing: with --json the page as the API answered it, else ``table`` of
    its items and, when there is more, the command that reads the next page (on stderr).
    ``unknown``: for a first page that is empty, what the filters name that does not exist;
    ``none_yet``: for one with no filters, what to say instead of "no ... yet" (None: that)."""
    page = client.get(path, **filters, limit=args.limit, cursor=args.cursor)
    if args.json:
        _emit_json(page)
        return EXIT_OK
    print(table(page["items"]))
    if not page["items"]:  # the header alone reads like a failure; stdout stays the table
        words = command.split()
        noun = words[0] if words[1] == "list" else words[1]
        if args.cursor:
            said = f"no more {noun}"
        elif any(v is not None for v in filters.values()):
            said = f"no {noun} match these filters{unknown()}"
        else:
            said = none_yet() or f"no {noun} yet"
        print(said, file=sys.stderr)
    if cursor := page.get("next_cursor"):
        # The --url given on the command line goes with it: the next page is of that server
        # (a token given there is never printed; it is looked up again as before).
        url = f" --url {shlex.quote(public_url(args.url))}" if args.url else ""
        more = f"more: qinglong {command}{url} --limit {args.limit} --cursor {cursor}"
        print(more, file=sys.stderr)
    return EXIT_OK


# -- runs ------------------------------------------------------------------------------------


def cmd_runs_start(client: Client, args: argparse.Namespace) -> int:
    """Enqueue a run; with --follow stream its log and exit by its status."""
    body: dict[str, Any] = {"task": args.task}
    if args.revision is not None:
        body["revision"] = args.revision
    if args.priority is not None:
        body["priority"] = args.priority
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    status, run = client.create("/runs", body, headers=headers)
    line = (
        f"run {run['id']} {run['status']} (task {render.safe(run['task'])} "
        f"revision {run['revision']}{_replayed(status)})"
    )
    if not args.follow:
        if args.json:
            _emit_json(run)
        else:
            print(line)
        return EXIT_OK
    print(line, file=sys.stderr)
    return _follow_and_report(client, run, attempt=None, args=args)


def _replayed(status: int) -> str:
    """The words for a run an Idempotency-Key made before (200, not 201): it may have ended
    long ago, and no new run was made."""
    return "; made before with this idempotency key, no new run" if status == 200 else ""


def cmd_runs_list(client: Client, args: argparse.Namespace) -> int:
    """One page of runs, newest first."""
    now = int(time.time() * 1000)  # one "now" for --since 2h and --until 1h alike
    since = until = None
    if args.since is not None:
        since = bodies.instant(args.since, flag="--since", now_ms=now)
    if args.until is not None:
        until = bodies.instant(args.until, flag="--until", now_ms=now)
    if since is not None and until is not None and since[1] >= until[1]:
        raise bodies.usage(
            f"--since {since[0]} is not before --until {until[0]}: no run can be in that window"
        )
    window = {"since": since and since[0], "until": until and until[0]}
    # The more: line repeats each filter, a relative --since as the instant it meant: the
    # next page is of the same window, however late it is asked.
    filters = "".join(
        f" --{name} {shlex.quote(value)}"
        for name, value in (
            ("task", args.task), ("status", args.status), ("schedule", args.schedule),
            *window.items(),
        )
        if value
    )  # fmt: skip
    return _listing(
        client, args, "/runs", render.runs_table, f"runs list{filters}",
        unknown=lambda: (
            _no_such(client, "task", args.task) or _no_such(client, "schedule", args.schedule)
        ),
        none_yet=lambda: None, task=args.task, status=args.status, schedule=args.schedule,
        **window,
    )  # fmt: skip


def _no_such(client: Client, kind: str, name: str | None) -> str:
    """``: no task is named T ...`` when --task (``kind`` "task") or --schedule ("schedule")
    names none now: a typo lists no runs, not an error. "" when it exists, cannot be asked
    (a token without definitions:read), or is not a name at all (the page's own request
    already said that)."""
    if name is None:
        return ""
    try:
        client.get(f"/{kind}s/{_seg(name)}")
    except ApiProblem as exc:
        if exc.code == f"{kind.upper()}_NOT_FOUND":
            return f": no {kind} is named {render.safe(name)} (qinglong {kind}s list)"
    except ClientError:
        pass
    return ""


def cmd_runs_show(client: Client, args: argparse.Namespace) -> int:
    """One run; in tables also its attempts."""
    run = client.get(f"/runs/{_seg(args.run)}")
    if args.json:
        _emit_json(run)
        return EXIT_OK
    print(render.run_fields(
        run, why_not_started=_why_not_started(client, run),
        cancel_reason=_cancel_reason(client, run),
        leftovers_stopped=_leftovers_stopped(client, run),
    ))  # fmt: skip
    attempts = client.get(f"/runs/{_seg(args.run)}/attempts")["items"]
    if len(attempts) > 1:
        print()
        print(render.attempts_table(attempts))
    return EXIT_OK


def cmd_runs_logs(client: Client, args: argparse.Namespace) -> int:
    """The log of the run's latest (or the given) attempt; --follow streams it."""
    run = client.get(f"/runs/{_seg(args.run)}")
    if args.follow:
        return _follow_and_report(client, run, attempt=args.attempt, args=args)
    number = args.attempt or (run.get("latest_attempt") or {}).get("number")
    if number is None:
        raise ClientError(f"run {args.run} has no attempt yet", EXIT_USAGE)
    data = client.log_bytes(run["id"], number)
    latest = run.get("latest_attempt") or {}
    if not data and args.attempt is None and number > 1 and latest.get("started_at_ms") is None:
        # A retry that never started (waiting, or cancelled in its wait): the output is an
        # earlier attempt's, and an empty stdout alone would say nothing.
        tried = client.get(f"/runs/{_seg(run['id'])}/attempts").get("items") or []
        ran = [a["number"] for a in tried if a.get("started_at_ms") is not None]
        where = (
            f"the last that ran: qinglong runs logs {render.safe(args.run)} --attempt {ran[-1]}"
            if ran else "none of its attempts has started yet"
        )  # fmt: skip
        print(f"attempt {number} has not started, so it has no output; {where}", file=sys.stderr)
    elif not data and (shown := _attempt(client, run, number) or {}).get(
        "started_at_ms", 0
    ) is None:
        # An attempt that never ran (a launch refused before the job, or not started yet):
        # an empty stdout alone would read as a job that printed nothing.
        code = shown.get("error_code")
        if shown.get("finished_at_ms") is not None or shown.get("status") in TERMINAL:
            why = f" ({render.safe(code)})" if code else ""
            print(
                f"attempt {number} never started{why}, so it has no output; why: "
                f"qinglong runs show {render.safe(args.run)}",
                file=sys.stderr,
            )
        else:
            print(f"attempt {number} has not started yet, so it has no output", file=sys.stderr)
    if args.json:
        text = data.decode("utf-8", errors="replace")
        _emit_json({"run": run["id"], "attempt": number, "text": text})
    elif sys.stdout.isatty() and not args.raw:
        # Shown, not copied: what the terminal cannot show is replaced (--raw keeps bytes).
        _write_shown(sys.stdout, render.terminal_text(data.decode("utf-8", errors="replace")))
    else:
        sys.stdout.flush()
        _write_all(sys.stdout.buffer, data)
        sys.stdout.flush()
    if data:
        _say_if_truncated(client, run, number)
    return EXIT_OK


def _say_if_truncated(client: Client, run: dict[str, Any], number: int) -> None:
    """On stderr, when attempt ``number``'s log was cut (its quota, a full disk): where the
    bytes went missing, mid-line perhaps, and whether what follows is the output's end
    (a log over its quota keeps its last bytes after the gap) or nothing."""
    try:
        attempt = _attempt(client, run, number) or {}
    except ClientError:
        return  # the run was read; its attempts were not (gone since, a scope): say nothing
    log = attempt.get("log") or {}
    if not log.get("truncated"):
        return
    size, dropped = log.get("bytes", 0), log.get("dropped_bytes", 0)
    reason = render.safe(log.get("truncation_reason") or "quota")
    gap = render.gap_of(log)
    if render.head_only(attempt):  # the job runs on: nothing is counted before it ends
        said = f"log holds the output's first {size} bytes: {render.HEAD_ONLY}"
    elif gap is None:
        said = f"log truncated at {size} bytes: {dropped} more bytes dropped ({reason})"
    else:
        said = (
            f"log truncated: {dropped} bytes dropped at byte {gap} ({reason}); "
            f"the last {size - gap} bytes are the output's end"
        )
    print(said, file=sys.stderr)


def _write_all(buffer: BinaryIO, data: bytes) -> None:
    """Every byte of ``data``, or BrokenPipeError. Unbuffered (PYTHONUNBUFFERED) stdout's
    write is one write(2): a pipe whose reader goes away mid-write takes part of it and
    answers that count, without an error."""
    view = memoryview(data)
    while view:
        view = view[buffer.write(view) :]


def _write_shown(stream: TextIO, text: str) -> None:
    """``text`` on ``stream`` in the stream's encoding, what it cannot hold replaced: a log
    line in Chinese on a Latin-1 terminal is ``??``, never a UnicodeEncodeError."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        stream.write(text)
    else:
        stream.flush()
        _write_all(buffer, text.encode(stream.encoding or "utf-8", errors="replace"))
    stream.flush()


def _attempt(client: Client, run: dict[str, Any], number: int) -> dict[str, Any] | None:
    """Attempt ``number`` of ``run``: its latest one as the run carries it, else read; None
    when the run has no such attempt."""
    latest: dict[str, Any] = run.get("latest_attempt") or {}
    if latest.get("number") == number:
        return latest
    tried = client.get(f"/runs/{_seg(run['id'])}/attempts").get("items") or []
    return next((a for a in tried if a.get("number") == number), None)


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


def cmd_runs_events(client: Client, args: argparse.Namespace) -> int:
    """One page of a run's events in ``seq`` order."""
    return _listing(
        client, args, f"/runs/{_seg(args.run)}/events", render.events_table,
        f"runs events {args.run}",
    )  # fmt: skip


def cmd_runs_rerun(client: Client, args: argparse.Namespace) -> int:
    """A new run of the same revision and priority; with --follow as ``runs start``."""
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    status, run = client.create(f"/runs/{_seg(args.run)}/rerun", headers=headers)
    line = (
        f"run {run['id']} {run['status']} (rerun of {render.safe(args.run)}, task "
        f"{render.safe(run['task'])} revision {run['revision']}{_replayed(status)})"
    )
    if args.follow:
        print(line, file=sys.stderr)
        return _follow_and_report(client, run, attempt=None, args=args)
    if args.json:
        _emit_json(run)
    else:
        print(line)
    return EXIT_OK


def cmd_runs_pin(client: Client, args: argparse.Namespace) -> int:
    """Pin or unpin a run (idempotent)."""
    run = client.post(f"/runs/{_seg(args.run)}/{args.pin_action}")
    if args.json:
        _emit_json(run)
    elif run["pinned"]:
        log = (run.get("latest_attempt") or {}).get("log") or {}
        if log.get("expired"):  # pinned too late for the log: only the rows are kept
            gone = render.when(log.get("expired_at_ms"))
            print(f"run {run['id']} pinned: retention keeps its rows; its log was removed "
                  f"{gone}, before the pin")  # fmt: skip
        else:
            print(f"run {run['id']} pinned: retention keeps its log and rows")
    else:
        print(f"run {run['id']} unpinned")
    return EXIT_OK


def _follow_and_report(
    client: Client, run: dict[str, Any], *, attempt: int | None, args: argparse.Namespace
) -> int:
    """Follow, print the final status line (and with --json the run); the exit code."""
    as_json = args.json
    log_out = sys.stderr if as_json else sys.stdout
    try:
        run, ended = _follow(client, run, log_out=log_out, only=attempt, raw=args.raw)
    except KeyboardInterrupt:
        log_out.flush()
        print(
            f"\nstopped following; run {run['id']} goes on "
            f"(`qinglong runs cancel {run['id']}` stops it)",
            file=sys.stderr,
        )
        return 130
    followed = attempt or (run.get("latest_attempt") or {}).get("number")
    if followed:
        _say_if_truncated(client, run, followed)
    if as_json:
        _emit_json(run)
    outcome = render.attempt_outcome(run.get("latest_attempt"))
    why = _why_not_started(client, run)
    detail = "" if outcome == "-" else f" ({outcome}: {why})" if why else f" ({outcome})"
    print(f"run {run['id']} {render.status_words(ended)}{detail}", file=sys.stderr)
    return EXIT_OK if ended == "succeeded" else EXIT_RUN_NOT_SUCCEEDED


def _cancel_reason(client: Client, run: dict[str, Any]) -> str | None:
    """``service_stop`` for a cancel ``serve --stop-jobs-on-exit`` asked (recorded ``user``
    for older builds; its ``run.cancel_requested`` event says so), else the run's reason."""
    cancel = run.get("cancel_requested") or {}
    reason = None if cancel.get("reason") is None else str(cancel["reason"])
    if reason != "user":
        return reason
    try:
        events = client.get(f"/runs/{_seg(run['id'])}/events", limit=200)["items"]
    except ClientError:
        return reason
    for event in events:  # it is among a run's first events: the first page holds it
        if event.get("type") == "run.cancel_requested":
            return "service_stop" if (event.get("data") or {}).get("service_stop") else reason
    return reason


def _leftovers_stopped(client: Client, run: dict[str, Any]) -> int:
    """How many processes the latest attempt's job left that were stopped when it ended
    (``leftovers_stopped`` on its ending event, docs/leftovers.md); 0 for an attempt that
    has not ended or never started, or when the events cannot be read (or its ending is
    past their first page of 200)."""
    attempt = run.get("latest_attempt") or {}
    if attempt.get("started_at_ms") is None or attempt.get("finished_at_ms") is None:
        return 0
    try:
        events = client.get(f"/runs/{_seg(run['id'])}/events", limit=200)["items"]
    except ClientError:
        return 0
    for event in reversed(events):
        data = event.get("data") or {}
        if str(event.get("type")).startswith("attempt.") and data.get("attempt") == attempt.get(
            "number"
        ) and "leftovers_stopped" in data:
            count = data["leftovers_stopped"]
            return count if isinstance(count, int) else 0
    return 0


def _why_not_started(client: Client, run: dict[str, Any]) -> str:
    """Why the run's latest attempt did not start (its launch failed, or a secret it needs
    is missing), in words (``render.start_failure``), from its ending event; "" for any
    other attempt, or when the events cannot be read."""
    attempt = run.get("latest_attempt") or {}
    if attempt.get("error_code") not in ("EXECUTOR_START_FAILED", "SECRET_NOT_FOUND"):
        return ""
    try:
        events = client.get(f"/runs/{_seg(run['id'])}/events", limit=200)["items"]
    except ClientError:
        return ""  # a token without the events' scope still gets the code
    for event in reversed(events):
        data = event.get("data") or {}
        if event.get("type") == "attempt.failed" and data.get("attempt") in (
            None, attempt.get("number")
        ):
            return render.start_failure(data)
    return ""


def _follow(
    client: Client, run: dict[str, Any], *, log_out: TextIO, only: int | None, raw: bool
) -> tuple[dict[str, Any], str]:
    """Stream each attempt's log in turn until the run ends; ``(run, final status)``.

    A requeued run (docs/backlog-requeue.md) gets a new attempt: its log follows the first
    one's. ``only``: follow that attempt and end with its status. On a terminal, unless
    ``raw``, the output is made safe for it (``render.TerminalText``).
    """
    run_id = run["id"]
    number = only or (run.get("latest_attempt") or {}).get("number") or 1
    tail = "\n"
    while True:
        status = ""
        screen = None if raw or not log_out.isatty() else render.TerminalText()
        for item in client.follow(run_id, number):
            if isinstance(item, LogChunk):
                if text := screen.feed(item.text) if screen else item.text:
                    _write_shown(log_out, text)
                    tail = text[-1]
            else:
                status = item.status
        if screen and (text := screen.end()):
            _write_shown(log_out, text)
            tail = text[-1]
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
                print(_next_attempt_line(client, run, number, status, latest), file=sys.stderr)
                number = latest
                break
            time.sleep(POLL_S)


def _next_attempt_line(
    client: Client, run: dict[str, Any], ended: int, status: str, latest: int
) -> str:
    """``attempt 1 ended failed (exit 3); following attempt 2, a retry that waits until ...``:
    the follow is silent through a retry's backoff (docs/retries.md §1), up to a day."""
    try:
        outcome = render.attempt_outcome(_attempt(client, run, ended))
    except ClientError:
        outcome = "-"  # the run was read; its attempts were not (a scope): the status says it
    said = f"attempt {ended} ended {render.status_words(status)}"
    said += "" if outcome == "-" else f" ({outcome})"
    waits = run.get("next_attempt_at_ms")
    if waits is None:  # a requeue (docs/backlog-requeue.md) or a retry that waits no more
        return f"{said}; following attempt {latest}"
    return f"{said}; following attempt {latest}, a retry that waits until {render.when(waits)}"


# -- tasks -----------------------------------------------------------------------------------


def cmd_tasks_list(client: Client, args: argparse.Namespace) -> int:
    """One page of tasks: not archived ones, or with --archived / --all those too."""
    if args.archived is None:

        def all_archived() -> str | None:  # one more request, only when the page is empty
            if not client.get("/tasks", archived="only", limit=1)["items"]:
                return None
            return "no tasks listed: every task is archived (qinglong tasks list --archived)"

        return _listing(
            client, args, "/tasks", render.tasks_table, "tasks list", none_yet=all_archived
        )
    flag = "--archived" if args.archived == "only" else "--all"
    return _listing(
        client, args, "/tasks", render.archived_tasks_table, f"tasks list {flag}",
        archived=args.archived,
    )  # fmt: skip


def cmd_tasks_archive(client: Client, args: argparse.Namespace) -> int:
    """Archive or unarchive a task (idempotent)."""
    task = client.post(f"/tasks/{_seg(args.task)}/{args.archive_action}")
    name = render.safe(task["task"])
    if args.json:
        _emit_json(task)
    elif task["archived"]:
        print(
            f"task {name} archived {render.when(task['archived_at_ms'])}: left out of tasks "
            f"list, no new runs (qinglong tasks unarchive {name} undoes it)"
        )
    else:
        print(f"task {name} unarchived: listed again, runs may start")
    return EXIT_OK


def cmd_tasks_show(client: Client, args: argparse.Namespace) -> int:
    """A task with its latest revision."""
    task = client.get(f"/tasks/{_seg(args.task)}")
    if args.json:
        _emit_json(task)
        return EXIT_OK
    recipe_id = (task.get("latest") or {}).get("recipe")
    recipe = client.get(f"/recipes/{_seg(recipe_id)}") if recipe_id else None
    print(render.task_fields(task, recipe=recipe))
    return EXIT_OK


def cmd_tasks_put(client: Client, args: argparse.Namespace) -> int:
    """Add a revision: the recipe first (``--env``/``--secret``), then the revision."""
    base = None
    if args.file is not None:
        base = bodies.load_revision_file(_read_file(args.file), source=_file_name(args.file))
    flags = vars(args)
    body = bodies.revision_body(base, args.job_argv, flags)  # usage errors before any request
    recipe_in = bodies.recipe_body(args.env, args.secret)
    recipe = None
    if recipe_in is not None:
        recipe = client.post("/recipes", recipe_in)
        body = bodies.revision_body(base, args.job_argv, flags, recipe=recipe["id"])
    task = _seg(args.task)
    if args.revision is not None:
        status, rev = client.put(f"/tasks/{task}/revisions/{args.revision}", body)
    else:
        status, rev = _put_next(client, task, body)
    if recipe is not None:
        _warn_missing_secrets(client, set(recipe["secrets"].values()))
    if args.json:
        _emit_json(rev)
        return EXIT_OK
    if recipe is not None:
        keys = ", ".join([*recipe["env"], *recipe["secrets"]])
        print(f"recipe {recipe['id']} ({render.safe(keys)})")
    what = "created" if status == 201 else "unchanged (the same content)"
    print(f"task {render.safe(rev['task'])} revision {rev['revision']} {what}: {rev['digest']}")
    return EXIT_OK


def _unset(client: Client, names: set[str]) -> set[str]:
    """Which of ``names`` no stored secret has; none when the list cannot be read (a
    refusal, no answer: the revision is saved all the same) or is over 20 pages long."""
    cursor = None
    for _ in range(20):
        if not names:
            return names
        try:
            page = client.get("/secrets", limit=200, cursor=cursor)
        except ClientError:
            return set()
        names = names - {item["name"] for item in page["items"]}
        cursor = page.get("next_cursor")
        if not cursor:
            return names
    return set()


def _warn_missing_secrets(client: Client, names: set[str]) -> None:
    """A warning on stderr for each named secret that is not set yet: its runs would fail
    SECRET_NOT_FOUND. Naming one before setting it is allowed (the order is the user's), so
    this never refuses; a token that may not list secrets (secrets:write) skips the check."""
    for name in sorted(_unset(client, names)):
        shown = render.safe(name)
        print(
            f"warning: secret {shown} is not set yet; its runs fail SECRET_NOT_FOUND until "
            f"`qinglong secrets set {shown}`",
            file=sys.stderr,
        )


def _put_next(client: Client, task: str, body: dict[str, Any]) -> tuple[int, Any]:
    """PUT ``body`` as the next revision; the latest itself when it has the same content.

    The api answers 200 for a PUT of the same content and 409 for another one, so "the
    same as the latest" is the server's own comparison (digests of canonical bodies).
    A number another client took in between is a 409 too: read the latest again.
    """
    for _ in range(3):
        try:
            latest = int(client.get(f"/tasks/{task}")["latest_revision"])
        except ApiProblem as exc:
            if exc.code != "TASK_NOT_FOUND":
                raise
            latest = 0
        try:
            if latest:
                return client.put(f"/tasks/{task}/revisions/{latest}", body)
        except ApiProblem as exc:
            if exc.code != "REVISION_CONFLICT":
                raise
        try:
            return client.put(f"/tasks/{task}/revisions/{latest + 1}", body)
        except ApiProblem as exc:
            if exc.code != "REVISION_CONFLICT":
                raise
    raise ClientError("other clients keep adding revisions of this task; try again", EXIT_API_ERROR)


def _read_file(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        with open(name, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ClientError(f"cannot read {name}: {reason}", EXIT_USAGE) from None


def _file_name(name: str) -> str:
    return "stdin" if name == "-" else name


def cmd_tasks_revisions(client: Client, args: argparse.Namespace) -> int:
    """One page of a task's revisions, newest first."""
    return _listing(
        client, args, f"/tasks/{_seg(args.task)}/revisions", render.revisions_table,
        f"tasks revisions {args.task}",
    )  # fmt: skip


def cmd_tasks_retention(client: Client, args: argparse.Namespace) -> int:
    """The task's retention; with flags, PUT the stored override changed by them."""
    path = f"/tasks/{_seg(args.task)}/retention"
    changes = {
        f: value for f in bodies.RETENTION_FIELDS if (value := getattr(args, f)) is not _UNSET
    }
    policy = client.get(path)
    if changes or args.clear:
        body = bodies.retention_body(policy["override"], changes, clear=args.clear)
        _, policy = client.put(path, body)
    if args.json:
        _emit_json(policy)
    else:
        print(render.retention_table(policy))
    return EXIT_OK


# -- system ----------------------------------------------------------------------------------


def cmd_system_ready(client: Client, args: argparse.Namespace) -> int:
    """``GET /readyz``: ready (exit 0) or 503 NOT_READY naming the failing checks (exit 3)."""
    ready = client.get_root("/readyz")
    if args.json:
        _emit_json(ready)
    else:
        checks = ", ".join(f"{k} {v}" for k, v in sorted(ready["checks"].items()))
        print(f"{render.safe(ready['status'])}: {render.safe(checks)}")
        limit = render.process_limit_line(ready.get("process_limit"))
        if limit is not None:
            print(render.safe(limit))
    return EXIT_OK


def cmd_system_storage(client: Client, args: argparse.Namespace) -> int:
    """``GET /system/storage`` (admin): log bytes, runs kept, free space, the last sweep."""
    storage = client.get("/system/storage")
    if args.json:
        _emit_json(storage)
    else:
        print(render.storage_fields(storage))
    return EXIT_OK


def cmd_system_token(client: Client, args: argparse.Namespace) -> int:
    """``GET /token``: what the token sent may do (a 403 elsewhere names one scope it lacks)."""
    mine = client.get("/token")
    if args.json:
        _emit_json(mine)
    else:
        print(render.token_fields(mine))
    return EXIT_OK


# -- schedules -------------------------------------------------------------------------------


def cmd_schedules_list(client: Client, args: argparse.Namespace) -> int:
    """One page of schedules."""
    return _listing(client, args, "/schedules", render.schedules_table, "schedules list")


def cmd_schedules_decisions(client: Client, args: argparse.Namespace) -> int:
    """One page of a schedule's slot decisions, newest first (why a slot did not run)."""
    return _listing(
        client, args, f"/schedules/{_seg(args.name)}/decisions", render.decisions_table,
        f"schedules decisions {args.name}",
    )  # fmt: skip


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
        print(f"schedule {render.safe(schedule['name'])} is {_schedule_state_words(schedule)}")
    return EXIT_OK


def _schedule_state_words(schedule: dict[str, Any]) -> str:
    """``paused``, ``active``, or, for one whose ``end_at_ms`` passed, ``ended`` and when: a
    resumed schedule with no slot left is not active."""
    state = render.schedule_state(schedule)
    if state != "ended":
        return state
    end = render.when(schedule["end_at_ms"])
    # Slots it missed while paused before that bound are still caught up (--catchup).
    return f"ended: its end bound, {end}, has passed; no slot after it fires"


def cmd_schedules_put(client: Client, args: argparse.Namespace) -> int:
    """Create or replace a schedule (``PUT``: every field not given takes its default)."""
    base = None
    if args.file is not None:
        base = bodies.load_schedule_file(_read_file(args.file), source=_file_name(args.file))
    body = bodies.schedule_body(base, vars(args))  # usage errors before any request
    path = f"/schedules/{_seg(args.name)}"
    headers = None
    if args.if_version is not None:
        headers = {"If-Match": _schedule_etag(client, args.name, args.if_version)}
    try:
        status, schedule = client.put(path, body, headers=headers)
    except ApiProblem as exc:
        if exc.status != 412:
            raise
        raise _changed_meanwhile(exc, args.name) from None
    # Stored as asked; said on stderr, --json too.
    for warning in (
        bodies.catchup_all_warning(body), bodies.max_concurrent_warning(body),
        bodies.every_zone_warning(schedule),
    ):  # fmt: skip
        if warning is not None:
            print(warning, file=sys.stderr)
    if args.json:
        _emit_json(schedule)
        return EXIT_OK
    what = "created" if status == 201 else "saved"
    fires = schedule.get("next_fires") or []
    nxt = f"; next {render.when(fires[0]['at_ms'])} ({fires[0]['local']})" if fires else ""
    state = render.schedule_state(schedule)
    state = "" if state == "active" else f", {state}"
    print(f"schedule {render.safe(schedule['name'])} {what} (version {schedule['version']}"
          f"{state}){render.safe(nxt)}")  # fmt: skip
    return EXIT_OK


def _schedule_etag(client: Client, name: str, version: int) -> str:
    """The stored schedule's ETag while it is at ``version``; the api then replaces that
    version only, so a change between this read and the PUT is a 412 too."""
    try:
        stored, etag = client.get_tagged(f"/schedules/{_seg(name)}")
    except ApiProblem as exc:
        if exc.status != 404:
            raise
        raise ApiProblem(
            exc.status, exc.code, f"{exc.message} (--if-version replaces a stored schedule)"
        ) from None
    if not etag:  # not this api (a proxy that drops headers?): refuse rather than overwrite
        raise ClientError(
            "the server sent no ETag for the schedule, so --if-version cannot be checked; "
            "nothing was saved",
            EXIT_API_ERROR,
        )
    if stored.get("version") != version:  # a stale or mistyped N: the server would refuse
        at = f"412 PRECONDITION_FAILED: it is at version {stored.get('version')}, not {version}"
        raise _changed_meanwhile(ApiProblem(412, "PRECONDITION_FAILED", at), name)
    return etag


def _changed_meanwhile(exc: ApiProblem, name: str) -> ApiProblem:
    return ApiProblem(
        exc.status, exc.code,
        f"{exc.message}; nothing was saved: see qinglong schedules show {render.safe(name)}",
    )  # fmt: skip


def cmd_schedules_delete(client: Client, args: argparse.Namespace) -> int:
    """DELETE a schedule; the api cancels its queued runs in the same transaction."""
    return _delete(
        client, args, "schedules",
        then=" (its queued runs were cancelled; runs already started go on to their end:"
        " qinglong runs list --status running)",
    )  # fmt: skip


def _delete(client: Client, args: argparse.Namespace, collection: str, *, then: str = "") -> int:
    """DELETE ``args.name`` from ``collection``; one line (or ``--json``) saying so."""
    client.request("DELETE", f"/api/v1/{collection}/{_seg(args.name)}")
    if args.json:
        _emit_json({"name": args.name, "deleted": True})
    else:
        print(f"{collection.removesuffix('s')} {render.safe(args.name)} deleted{then}")
    return EXIT_OK


# -- secrets (write-only values, docs/api.md §5) ---------------------------------------------


def cmd_secrets_list(client: Client, args: argparse.Namespace) -> int:
    """One page of secret names (never values)."""
    return _listing(client, args, "/secrets", render.secrets_table, "secrets list")


def cmd_secrets_set(client: Client, args: argparse.Namespace) -> int:
    """PUT a secret's value, read from the terminal without echo or from stdin (never argv)."""
    if not bodies.NAME.fullmatch(args.name):
        raise ClientError(
            "a secret's name is lower-case letters, digits, '.', '_' and '-', starting with a "
            "letter or digit; nothing was read or set",
            EXIT_USAGE,
        )
    if sys.stdin.isatty():
        value = _hidden(f"value of {args.name}: ", "no value given; nothing was set")
    else:
        try:  # the bytes, not the locale's reading of them, which may keep them as surrogates
            # One line end: "\r\n" too, from a file saved on Windows, whose \r would
            # otherwise end the value (a cookie that no longer matches).
            text = sys.stdin.buffer.read().decode("utf-8")
            value = text.removesuffix("\r\n") if text.endswith("\r\n") else text.removesuffix("\n")
        except OSError as exc:  # EIO of a terminal gone: the input's error, not the output's
            raise ClientError(
                f"cannot read the value from stdin: {exc.strerror}", EXIT_USAGE
            ) from None
        except UnicodeDecodeError:
            raise ClientError(
                "the value on stdin is not UTF-8 text, and a secret is text: give a binary "
                f"one as base64 (base64 -w0 FILE | qinglong secrets set {render.safe(args.name)});"
                " nothing was set",
                EXIT_USAGE,
            ) from None
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
    return _delete(client, args, "secrets")


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
                    raise _no_route(exc, url) from None
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


def _hidden(prompt: str, nothing: str) -> str:
    """What the terminal answers ``prompt`` without echo; Ctrl-D is ClientError(``nothing``),
    exit 2 (getpass leaves the line without its newline: one is written first)."""
    try:
        return getpass.getpass(prompt)
    except EOFError:
        print(file=sys.stderr)
        raise ClientError(nothing, EXIT_USAGE) from None


def _read_token() -> str:
    if sys.stdin.isatty():
        token = _hidden("API token: ", "no token given; nothing was saved").strip()
        if not token:  # Enter alone: not "run qinglong login" to a user who is running it
            raise ClientError("no token given; nothing was saved", EXIT_USAGE)
        return token
    try:
        return sys.stdin.readline().strip()
    except OSError as exc:  # not the config file's error, which login's caller names
        raise ClientError(f"cannot read the token from stdin: {exc.strerror}", EXIT_USAGE) from None


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _seg(value: str) -> str:
    """One path segment; an empty one would name the collection instead (``/runs/``), whose
    404 reads as a wrong --url."""
    if not value:
        raise ClientError(
            "an empty id or name was given (an unset shell variable?); nothing was sent",
            EXIT_USAGE,
        )
    return path_segment(value)
