"""``qinglong lease show|history``: who holds the worker lease, and the service history."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from app.cli.common import database

_HISTORY_MAX = 1000


def _limit(value: str) -> int:
    number = int(value)
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


def _utc(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
            if lease.released_at_ms is not None:
                state = f"released at {_utc(lease.released_at_ms)}"
            elif lease.live(now):
                state = f"held, expires {_utc(lease.expires_at_ms)} unless renewed"
            else:
                state = f"expired at {_utc(lease.expires_at_ms)}"
                # The epoch moved past what that pid held: say who moved it, and why.
                moved = repo.superseded(lease.instance_id, lease.epoch)
                if moved is not None:
                    state += (
                        f"; host {moved.by_host} ended its {moved.attempts_lost} active "
                        f"attempt(s) lost and moved its epoch from {moved.held_epoch}, so that "
                        "worker, back, is refused"
                    )
            api = f" api {lease.base_url}" if lease.base_url else ""
            lines.append(
                f"instance {lease.instance_id} host {lease.host} pid {lease.pid} "
                f"epoch {lease.epoch}{api} since {_utc(lease.acquired_at_ms)}: {state}"
            )
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
        print(f"{_utc(event.at_ms)}\t{event.type}\t{facts}")
    return 0
