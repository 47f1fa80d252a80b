"""The ``qinglong`` command line: one sub-command module per concern.

The client commands (``app/cli/client``: runs, tasks, schedules, system, login, logout) talk HTTP
only; for them the service's own modules (storage, the api, the supervisor) are not
imported at all, so a client command starts in a fraction of the time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]

CLIENT_COMMANDS = frozenset({"runs", "tasks", "schedules", "system", "login", "logout"})


class _Version(argparse.Action):
    """``--version``: read only when asked (the migrations are not loaded for every command)."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kw: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from app.storage.migrate import head_revision

        try:
            build = version("qinglong-control")
        except PackageNotFoundError:
            build = "unknown"
        print(f"qinglong-control {build} (database migrations up to {head_revision()})")
        parser.exit()


# One wording everywhere --data-dir is taken (app/settings.py DEFAULT_DATA_DIR; a unit test
# holds the two together): this module does not import the settings, to start fast.
DATA_DIR_HELP = "data directory (default $QL_DATA_DIR, else ./.qinglong in the current directory)"


def build_parser(*, client_only: bool = False) -> argparse.ArgumentParser:
    """The full argument parser; each module registers its own sub-commands.

    ``client_only``: only the client commands (what ``main`` uses when one is named,
    ``secrets list|set|delete`` included).
    """
    from app.cli import client

    parser = argparse.ArgumentParser(
        prog="qinglong", description="Run local tasks safely and record how they ended."
    )
    parser.add_argument("--data-dir", help=DATA_DIR_HELP)
    parser.add_argument(
        "--version", action=_Version, nargs=0,
        help="the build's version and the newest database migration it knows (a rollback "
        "may go only to a build that knows the database's migration)",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if not client_only:
        from app.cli import admin, lease, logs, receipts, secrets, serve, worker

        admin.register(sub)
        serve.register(sub)
        secrets.register(sub)
        receipts.register(sub)
        logs.register(sub)
        worker.register(sub)
        lease.register(sub)
        for name, command in sub.choices.items():
            if name not in CLIENT_COMMANDS:
                _data_dir_after(command)
    client.register(sub, with_secrets=client_only)
    return parser


def _data_dir_after(parser: argparse.ArgumentParser) -> None:
    """``--data-dir`` after the command too (``qinglong token list --data-dir X``), as
    docs/api.md §8 promises: on every leaf of a service command that lacks it, without a
    default, so the value given before the command stays when none is given after."""
    children = _subcommands(parser)
    for child in children.values():
        _data_dir_after(child)
    if not children and "--data-dir" not in parser._option_string_actions:
        parser.add_argument("--data-dir", default=argparse.SUPPRESS, help=DATA_DIR_HELP)


def _is_client_command(argv: Sequence[str]) -> bool:
    """``argv`` names a client command (``--data-dir DIR`` skipped)."""
    from app.cli.client import SECRET_ACTIONS

    words: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--data-dir":
            next(args, None)
        elif not arg.startswith("-"):
            words.append(arg)
            if len(words) == 2:
                break
    if not words:
        return False
    if words[0] == "secrets":
        return len(words) == 2 and words[1] in SECRET_ACTIONS
    return words[0] in CLIENT_COMMANDS


_DATA_DIR_TO_CLIENT = (
    "--data-dir is for the service's own commands; this one talks to an api: give --url (or QL_URL)"
)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parse_args``, but an unknown option is refused by the sub-command it was given to,
    with that command's usage (argparse leaves it to the top parser, whose usage is of no
    help: ``qinglong [-h] [--data-dir DATA_DIR] COMMAND ...``)."""
    args, extras = parser.parse_known_args(argv)
    if any(word == "--data-dir" or word.startswith("--data-dir=") for word in extras):
        # Only a client command lacks the option (every service command takes it): given
        # after the command, as `token bootstrap --data-dir DIR` is, it is refused the same
        # way as before it (main).
        _leaf(parser, argv).error(_DATA_DIR_TO_CLIENT)
    if extras:
        _leaf(parser, argv).error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def _leaf(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The deepest sub-command parser the words of ``argv`` name. A word right after an
    option is its value (``--data-dir runs``): the parsers above a leaf have no flag without
    a value, and a leaf has no sub-commands to walk into."""
    current = parser
    after_option = False
    for word in argv:
        children = _subcommands(current)
        if not after_option and word in children:
            current = children[word]
        after_option = word.startswith("-") and "=" not in word
    return current


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's sub-command parsers by name ({} for a leaf)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if _is_client_command(argv):
        # Everything after the first ``--`` is a job's argv (``tasks put TASK -- ARGV...``),
        # kept verbatim: argparse would read its options as ours.
        head, rest = argv, None
        if "--" in argv:
            cut = argv.index("--")
            head, rest = argv[:cut], argv[cut + 1 :]
        parser = build_parser(client_only=True)
        client_args = _parse(parser, head)
        if getattr(client_args, "data_dir", None) is not None:
            # Taken and ignored, it read as "the service of that data dir" (docs/api.md §8).
            _leaf(parser, head).error(_DATA_DIR_TO_CLIENT)
        if rest is not None:
            if not hasattr(client_args, "job_argv"):
                _leaf(parser, head).error(f"unrecognized arguments: -- {' '.join(rest)}")
            client_args.job_argv = rest
        try:
            code: int = client_args.handler(client_args)
        except KeyboardInterrupt:
            return 130
        return code
    return _service_main(argv)


def _sqlite_without_room(args: argparse.Namespace, exc: BaseException) -> bool:
    """SQLite could not open its database for want of room or a writable mount, rather than
    for a wrong path (app/storage/unavailable.py)."""
    from app.cli.common import settings_for
    from app.storage.engine import sqlite_path
    from app.storage.unavailable import cannot_open_for_room

    try:
        database = sqlite_path(settings_for(args).database_url)
    except ValueError:
        return False
    return database is not None and cannot_open_for_room(exc, database)


def _stdout_reader_gone() -> bool:
    """stdout is a pipe whose reader closed it (poll says POLLERR on its write end on
    Linux, POLLHUP on the BSDs)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        gone = select.POLLERR | select.POLLHUP
        return any(events & gone for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _service_main(argv: list[str]) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from app.cli.common import REFUSAL, ApiCannotStart, KeyFileMissing, NoDatabase
    from app.domain.errors import (
        DatabaseUnreachable,
        DomainError,
        KeyUnavailable,
        StorageUnavailable,
    )
    from app.storage.durable import CannotMake
    from app.storage.private_files import SERVICE_UMASK

    # Every file and directory a role creates is private to the service's OS user (SQLite's
    # database and its -wal/-shm included); children (api workers, worker, shims) inherit it.
    os.umask(SERVICE_UMASK)
    parser = build_parser()
    args = _parse(parser, argv)
    handler: Handler = args.handler
    try:
        code = handler(args)
        # What print() buffered is written here: at the interpreter's exit a reader gone
        # (``token list | head``) would be "Exception ignored" and exit 120.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():  # another pipe of the command's: not ours to hide
            raise
        # As the client commands (docs/cli.md §4): the reader stopped early, no traceback.
        from app.cli.client import EXIT_BROKEN_PIPE, quiet_stdout  # loaded by build_parser

        quiet_stdout()
        created = getattr(args, "token_created", None)
        if created is not None:  # shown once and now lost: an unknown copy must not live on
            print(
                f"token {created} was created but its output did not reach a reader: revoke "
                f"it (qinglong token revoke {created}) and create another",
                file=sys.stderr,
            )
        return EXIT_BROKEN_PIPE
    except ApiCannotStart as exc:
        from app.api.start_failure import EXIT_CANNOT_START

        REFUSAL.refuse(str(exc))
        return EXIT_CANNOT_START
    except (NoDatabase, KeyFileMissing, CannotMake) as exc:
        REFUSAL.refuse(str(exc))
        return 1
    except KeyUnavailable as exc:
        REFUSAL.refuse(
            f"{exc}: a stored secret does not decrypt under this key ring. With "
            "QL_SECRET_KEY, list the new key first and every older key a secret still uses "
            "after it (new,old); with the key file, restore the secret.key that wrote them "
            "(docs/operations.md)"
        )
        return 1
    except DatabaseUnreachable as exc:
        from app.storage.unavailable import connect_failure_reason

        # The driver's words tell a server that is down from a login it refused.
        reason = connect_failure_reason(exc)
        said = f" (DATABASE_UNREACHABLE): {reason};" if reason else " (DATABASE_UNREACHABLE);"
        REFUSAL.refuse(
            f"the database did not answer or refused the connection{said} check "
            "QL_DATABASE_URL and that the server is up"
        )
        return 1
    except (DomainError, StorageUnavailable) as exc:
        REFUSAL.refuse(exc.detail)
        return 1
    except SQLAlchemyError as exc:
        from app.storage.unavailable import is_storage_unavailable

        if is_storage_unavailable(exc) or _sqlite_without_room(args, exc):
            # Outside a unit of work: SQLite opening its -wal on a full disk, or unable to
            # make it at all (no inode left, a read-only mount).
            REFUSAL.refuse(StorageUnavailable.detail)
            return 1
        # Never echo the URL (it may hold a password) or a traceback.
        REFUSAL.refuse(
            f"the database is not reachable or not usable ({type(exc).__name__}); "
            "check QL_DATABASE_URL and run `qinglong migrate`"
        )
        return 1
    except ValueError as exc:
        REFUSAL.refuse(str(exc))
        return 2
    except ImportError as exc:
        # A broken install (a module of the web stack or a driver that does not import,
        # found by a handler's own imports): one line, as app/api/startup.py says a worker's.
        from app.api.start_failure import EXIT_CANNOT_START, cannot_start

        REFUSAL.refuse(cannot_start(exc, f"the {args.command} command"))
        return EXIT_CANNOT_START
    except KeyboardInterrupt:
        return 130
