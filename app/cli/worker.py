"""``qinglong worker``: the worker process (control socket, launcher, live completion)."""

from __future__ import annotations

import argparse
import logging
import resource
import signal
from types import FrameType
from typing import Any

from app.cli.common import REFUSAL, fd_room, make_first_start_files, private_settings
from app.domain.errors import LeaseHeld, NotMigrated

# Files the worker holds besides one pidfd a running shim: the database, its socket and
# connections, the journal, the zygote's pipes, logs being settled.
WORKER_FD_RESERVE = 256


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

    # From here on, a refusal too is a line with the time and the role (docs/operations.md §5).
    REFUSAL.log_lines("worker")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # the schema check is not news
    settings = private_settings(args, binds_socket=True)
    # One pidfd a running shim (the watcher), besides the files of the worker itself.
    wanted = settings.max_running + WORKER_FD_RESERVE
    if not fd_room(wanted):
        logging.getLogger(__name__).warning(
            "QL_MAX_RUNNING=%d needs about %d open files in the worker, and its hard limit "
            "(RLIMIT_NOFILE) is %d: raise LimitNOFILE= in its unit, or lower QL_MAX_RUNNING",
            settings.max_running, wanted, resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        )  # fmt: skip
    if settings.job.configured:  # a job user it cannot run jobs as: refused before any file
        from app.worker.job_user import job_policy

        job_policy(settings.job)
    cannot = make_first_start_files(settings, key=False)  # its instance id
    if cannot is not None:
        REFUSAL.refuse(cannot)
        return 1
    process = WorkerProcess(settings)

    def _on_signal(_signum: int, _frame: FrameType | None) -> None:
        process.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        process.start()
    except NotMigrated as exc:
        REFUSAL.refuse(exc.detail)
        return 1
    except SocketInUse as exc:
        REFUSAL.refuse(str(exc))
        return 1
    except LeaseHeld as exc:
        REFUSAL.refuse(exc.detail)  # the one line an operator needs
        return EXIT_LEASE_HELD
    process.serve_forever()
    lease = process.lease
    return EXIT_LEASE_LOST if lease is not None and lease.lost else 0
