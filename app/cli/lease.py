"""``qinglong lease show|history|retire``: who holds the worker lease, the service history,
and an operator's word that a stopped host is gone for good."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import uuid
from typing import TYPE_CHECKING, Any

from app.cli.common import database
from app.domain.ids import utc_instant

if TYPE_CHECKING:
    from app.domain.lease import Lease

_HISTORY_MAX = 1000


def _limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:  # argparse would say "invalid _limit value", naming this function
        raise argparse.ArgumentTypeError(
            f"a whole number 1..{_HISTORY_MAX} is required, not {value!r}"
        ) from None
    if not 1 <= number <= _HISTORY_MAX:
        raise argparse.ArgumentTypeError(f"must be 1..{_HISTORY_MAX}")
    return number


def register(sub: Any) -> None:
    """Add ``lease`` to the parser."""
    lease = sub.add_parser("lease", help="the worker lease (docs/worker-lease.md)")
    lsub = lease.add_subparsers(dest="lease_command", metavar="ACTION", required=True)
    lsub.add_parser("show", help="who holds each worker lease, and until when").set_defaults(
        handler=cmd_lease_show
    )
    history = lsub.add_parser(
        "history", help="service events: lease acquisitions, takeovers, releases (oldest first)"
    )
    history.add_argument("--limit", type=_limit, default=50, help="newest N events (default 50)")
    history.set_defaults(handler=cmd_lease_history)
    retire = lsub.add_parser(
        "retire",
        help="a host gone for good: end its stopped worker's runs still running lost "
        "(docs/several-hosts.md §4)",
    )
    retire.add_argument("instance_id", metavar="INSTANCE", help="its instance id (lease show)")
    retire.set_defaults(handler=cmd_lease_retire)


def _line(lease: Lease, state: str) -> str:
    api = f" api {lease.base_url}" if lease.base_url else ""
    return (
        f"instance {lease.instance_id} host {lease.host} pid {lease.pid} "
        f"epoch {lease.epoch}{api} since {utc_instant(lease.acquired_at_ms)}: {state}"
    )


def cmd_lease_show(args: argparse.Namespace) -> int:
    """One line per lease (SQLite has one; PostgreSQL one per host's instance): the holder,
    its epoch and times, its advertised api, and whether it is live now."""
    from app.storage.lease_repo import LeaseRepository, db_now_ms
    from app.storage.uow import UnitOfWork

    with database(args) as (_, engine):
        repo = LeaseRepository(engine)
        leases = repo.leases()
        with UnitOfWork(engine, write=False) as uow:
            now = db_now_ms(uow.conn)
        lines = []
        for lease in leases:
            if lease.live(now):
                held = f"held, expires {utc_instant(lease.expires_at_ms)} unless renewed"
                lines.append(_line(lease, held))
                continue
            if lease.released_at_ms is not None:
                state = f"released at {utc_instant(lease.released_at_ms)}"
            else:
                state = f"expired at {utc_instant(lease.expires_at_ms)}"
            # The epoch moved past what that pid held: say who moved it, and why.
            moved = repo.superseded(lease.instance_id, lease.epoch)
            if moved is not None and moved.retired:
                state += (
                    f"; retired from host {moved.by_host}: its {moved.attempts_lost} attempt(s) "
                    "still active ended lost"
                )
            elif moved is not None:
                state += (
                    f"; host {moved.by_host} ended its {moved.attempts_lost} active "
                    f"attempt(s) lost and moved its epoch from {moved.held_epoch}, so that "
                    "worker, back, is refused"
                )
            lines.append(_line(lease, state))
    if not leases:
        print("no worker has taken the lease yet")
        return 0
    print("\n".join(lines))
    return 0


def cmd_lease_history(args: argparse.Namespace) -> int:
    """One tab-separated line per event: time, type, canonical JSON facts."""
    from app.storage.lease_repo import LeaseRepository

    with database(args) as (_, engine):
        events = LeaseRepository(engine).history(limit=args.limit)
    for event in events:
        facts = json.dumps(event.data, sort_keys=True, separators=(",", ":"))
        print(f"{utc_instant(event.at_ms)}\t{event.type}\t{facts}")
    return 0




def cmd_lease_retire(args: argparse.Namespace) -> int:
    """End the attempts still active of a host whose worker stopped and will not come back
    (its lease released, or expired): ``lost`` ``WORKER_RETIRED``, never retried. Refused
    while its worker holds the lease. Exit 0 when done (nothing active is done too), 1 when
    refused or unknown."""
    from sqlalchemy.exc import OperationalError

    from app.domain.errors import VersionConflict
    from app.storage.hosts_repo import HOST_PAGE, retire_host
    from app.storage.lease_repo import LeaseRepository

    try:
        instance_id = str(uuid.UUID(args.instance_id))
    except ValueError:
        print(f"error: {args.instance_id!r} is not an instance id (qinglong lease show lists "
              "them)", file=sys.stderr)  # fmt: skip
        return 2
    with database(args) as (_, engine):
        slot = LeaseRepository(engine).slot_of(instance_id)
        try:
            done = retire_host(
                engine, slot=slot, instance_id=instance_id, by_host=socket.gethostname(),
                limit=HOST_PAGE,
            )  # fmt: skip
        except (VersionConflict, OperationalError):
            # A run of it moved meanwhile, or its rows stayed locked by a session of that
            # host: that page wrote nothing; the pages before it stand.
            print("error: a run of that host changed, or its rows stayed locked, while they "
                  "were ended; nothing of that page was written: give the command again",
                  file=sys.stderr)  # fmt: skip
            return 1
    if done.state != "retired" and done.attempts_lost:
        # The lease was taken between two pages: by its worker (held), or on SQLite by
        # another instance (unknown); the line after says which.
        print(f"{done.attempts_lost} attempt(s) of instance {instance_id} ended lost "
              "WORKER_RETIRED before the command stopped:", file=sys.stderr)  # fmt: skip
    if done.state == "unknown":
        print(f"error: no worker lease of instance {instance_id} on this database (qinglong "
              "lease show lists them)", file=sys.stderr)  # fmt: skip
        return 1
    if done.state == "held":
        print(f"error: instance {instance_id} on host {done.host} holds its lease until "
              f"{utc_instant(done.expires_at_ms)} unless renewed: its worker runs. Stop it (an "
              "orderly stop releases the lease), or, if its host is gone, wait for the expiry",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"retired instance {instance_id} (host {done.host}): {done.attempts_lost} attempt(s) "
          f"still active ended lost WORKER_RETIRED; its lease's epoch is {done.epoch}")  # fmt: skip
    return 0
