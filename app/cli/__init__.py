"""The ``qinglong`` command line: one sub-command module per concern."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from sqlalchemy.exc import SQLAlchemyError

from app.cli import admin, lease, logs, receipts, secrets, serve, worker
from app.domain.errors import DomainError, StorageUnavailable
from app.storage.private_files import SERVICE_UMASK

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; each module registers its own sub-commands."""
    parser = argparse.ArgumentParser(
        prog="qinglong", description="Run local tasks safely and record how they ended."
    )
    parser.add_argument("--data-dir", help="data directory (default $QL_DATA_DIR or ./.qinglong)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    admin.register(sub)
    serve.register(sub)
    secrets.register(sub)
    receipts.register(sub)
    logs.register(sub)
    worker.register(sub)
    lease.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    # Every file and directory a role creates is private to the service's OS user (SQLite's
    # database and its -wal/-shm included); children (api workers, worker, shims) inherit it.
    os.umask(SERVICE_UMASK)
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (DomainError, StorageUnavailable) as exc:
        print(f"qinglong: {exc.detail}", file=sys.stderr)
        return 1
    except SQLAlchemyError as exc:
        # Never echo the URL (it may hold a password) or a traceback.
        print(
            f"qinglong: the database is not reachable or not usable ({type(exc).__name__}); "
            "check QL_DATABASE_URL and run `qinglong migrate`",
            file=sys.stderr,
        )
        return 1
    except ValueError as exc:
        print(f"qinglong: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
