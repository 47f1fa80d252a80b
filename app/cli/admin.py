"""Administrative sub-commands: ``migrate`` and ``token create|list|revoke``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from app.cli.common import database
from app.domain.ids import utc_instant
from app.domain.tokens import SCOPES, new_api_token
from app.domain.validation import validate_name

if TYPE_CHECKING:
    from app.storage.tokens_repo import TokenRepository


def register(sub: Any) -> None:
    """Add ``migrate`` and ``token`` to the parser."""
    migrate = sub.add_parser("migrate", help="create or upgrade the database schema")
    migrate.set_defaults(handler=cmd_migrate)

    token = sub.add_parser("token", help="manage API tokens")
    tsub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = tsub.add_parser("create", help="create a token and print it once")
    create.add_argument(
        "--scope",
        dest="scopes",
        action="extend",
        nargs="+",
        required=True,
        choices=sorted(SCOPES),
        metavar="SCOPE",
        help=f"one or more of: {', '.join(sorted(SCOPES))}",
    )
    create.add_argument("--name", help="a unique name (default: token-<time>)")
    create.add_argument(
        "--expires-in",
        type=_duration_ms,
        metavar="DURATION",
        help="refused after this long: a number and s, m, h or d (90d, 12h); "
        "default: valid until revoked",
    )
    create.set_defaults(handler=cmd_token_create)
    tsub.add_parser(
        "bootstrap", help="create the first admin token if no token exists yet"
    ).set_defaults(handler=cmd_token_bootstrap)
    tsub.add_parser("list", help="list tokens (never their values)").set_defaults(
        handler=cmd_token_list
    )
    revoke = tsub.add_parser("revoke", help="revoke a token by name")
    revoke.add_argument("name")
    revoke.set_defaults(handler=cmd_token_revoke)


_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# At most ten years: the instant must stay a sane date, and a longer one is "never".
_MAX_EXPIRY_MS = 3650 * _UNIT_MS["d"]


def _duration_ms(text: str) -> int:
    """``--expires-in``: ``90d``, ``12h``, ``30m`` or ``600s``, one minute to ten years."""
    number, unit = text[:-1], text[-1:].lower()
    if unit not in _UNIT_MS or not number.isascii() or not number.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a number and s, m, h or d (90d, 12h, 30m)"
        )
    ms = int(number) * _UNIT_MS[unit]
    if not 60_000 <= ms <= _MAX_EXPIRY_MS:
        raise argparse.ArgumentTypeError("must be between 1 minute and 3650 days")
    return ms


def _tokens(engine: Engine) -> TokenRepository:
    from app.storage.tokens_repo import TokenRepository

    return TokenRepository(engine)


def cmd_migrate(args: argparse.Namespace) -> int:
    """Upgrade the database to the newest migration."""
    from app.storage.migrate import head_revision, upgrade_to_head

    with database(args, private=True) as (_, engine):
        upgrade_to_head(engine)
    print(f"database migrated to head ({head_revision()})")  # what a rollback must know
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    """Create a token; the plaintext is printed alone on the last line, once."""
    name = args.name or f"token-{time.strftime('%Y%m%d-%H%M%S')}"
    validate_name(name, what="token name")
    with database(args) as (_, engine):
        token = new_api_token()
        record = _tokens(engine).create(
            name=name, scopes=frozenset(args.scopes), token=token, expires_in_ms=args.expires_in
        )
    args.token_created = record.name  # said if the output is lost (app/cli/__init__.py)
    expiry = "" if record.expires_at_ms is None else f"; it expires {_utc(record.expires_at_ms)}"
    print(f"created token {record.name} with scopes {' '.join(sorted(record.scopes))}{expiry}")
    print("store it now: it is shown only once")
    print(token)
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    """List token names, state (active, revoked or expired), scopes, and when each was
    created, revoked and expires (UTC), one tab-separated line each; ``-`` for none. On a
    terminal a header line comes first, as the other tables have; a script reads one line a
    token, as it always did (EXPIRES came last, after the columns it already read)."""
    with database(args) as (_, engine):
        records = _tokens(engine).list()
    if sys.stdout.isatty():
        print("\t".join(("NAME", "STATE", "SCOPES", "CREATED", "REVOKED", "EXPIRES")))
    if not records:  # nothing at all reads like a failure; stdout stays the table
        print("no tokens yet", file=sys.stderr)
    now = int(time.time() * 1000)
    for record in records:
        print("\t".join((
            record.name, record.state(now), " ".join(sorted(record.scopes)),
            _utc(record.created_at_ms), _utc(record.revoked_at_ms), _utc(record.expires_at_ms),
        )))  # fmt: skip
    return 0


def _utc(ms: int | None) -> str:
    """An instant of the token table, to the second (its milliseconds are noise there)."""
    if ms is None:
        return "-"
    return utc_instant(ms - ms % 1000)


def cmd_token_revoke(args: argparse.Namespace) -> int:
    """Revoke a token by name."""
    with database(args) as (_, engine):
        record, revoked_now = _tokens(engine).revoke(args.name)
    # Idempotent (exit 0 either way, so a script can "make sure"), but never a second claim.
    if revoked_now:
        print(f"revoked token {args.name}")
    else:
        print(f"token {args.name} was already revoked ({_utc(record.revoked_at_ms)})")
    return 0


def cmd_token_bootstrap(args: argparse.Namespace) -> int:
    """Print a new admin token once: only while the database has no token at all."""
    with database(args) as (_, engine):
        repo = _tokens(engine)
        if repo.list():
            print("an API token already exists; create more with `qinglong token create`")
            return 0
        token = new_api_token()
        repo.create(name="admin", scopes=frozenset({"admin"}), token=token)
    args.token_created = "admin"
    print("created the admin token; store it now, it is shown only once:")
    print(token)
    return 0
