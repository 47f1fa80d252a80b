"""``qinglong worker``: the worker process (control socket, launcher, live completion)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType
from typing import Any

from app.cli.common import private_settings
from app.domain.errors import LeaseHeld, NotMigrated


def register(sub: Any) -> None:
    """Add ``worker`` to the parser."""
    worker = sub.add_parser(
        "worker", help="run the worker (expects a migrated database; never migrates)"
    )
    worker.set_defaults(handler=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    """Serve the worker socket until SIGTERM or SIGINT (or the lease is lost); jobs keep running.

    Exits ``EXIT_LEASE_HELD`` when another live worker holds the lease (docs/worker-lease.md).
    """
    from app.context.worker_lease import EXIT_LEASE_HELD, EXIT_LEASE_LOST
    from app.context.worker_process import WorkerProcess
    from app.worker.server import SocketInUse

    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # the schema check is not news
    process = WorkerProcess(private_settings(args, binds_socket=True))

    def _on_signal(_signum: int, _frame: FrameType | None) -> None:
        process.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        process.start()
    except NotMigrated as exc:
        print(f"qinglong: {exc.detail}", file=sys.stderr)
        return 1
    except SocketInUse as exc:
        print(f"qinglong: {exc}", file=sys.stderr)
        return 1
    except LeaseHeld as exc:
        print(f"qinglong: {exc.detail}", file=sys.stderr)  # the one line an operator needs
        return EXIT_LEASE_HELD
    process.serve_forever()
    lease = process.lease
    return EXIT_LEASE_LOST if lease is not None and lease.lost else 0
