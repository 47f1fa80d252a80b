"""Migration 0012, a token's expiry, down and up again on a database with tokens."""

from __future__ import annotations

from alembic import command
from sqlalchemy import Engine, select

from app.domain.ids import now_ms
from app.storage.migrate import upgrade_to_head
from app.storage.tables import api_tokens
from app.storage.tokens_repo import TokenRepository
from tests.storage.test_upgrade_from_0004 import empty_engine, migrate_to

__all__ = ["empty_engine"]  # the fixture, on a fresh SQLite file or a private PG schema


def test_a_downgrade_below_0012_refuses_an_expiring_token_rather_than_keep_it_for_good(
    empty_engine: Engine,
) -> None:
    engine = empty_engine
    upgrade_to_head(engine)
    repo = TokenRepository(engine)
    repo.create(name="forever", scopes=frozenset({"runs:read"}), token="ql_" + "a" * 43)
    repo.create(
        name="month", scopes=frozenset({"runs:read"}), token="ql_" + "b" * 43,
        expires_in_ms=30 * 86_400_000,
    )  # fmt: skip
    migrate_to(engine, "0011", command.downgrade)
    with engine.connect() as conn:  # 0011's columns: a build that knows no expiry reads these
        rows = {r.name: r.revoked_at_ms for r in conn.execute(
            select(api_tokens.c.name, api_tokens.c.revoked_at_ms))}  # fmt: skip
    assert rows["forever"] is None  # still valid, as it was
    assert rows["month"] is not None and rows["month"] > now_ms()  # refused at once
    upgrade_to_head(engine)
    assert repo.authenticate("ql_" + "a" * 43) is not None
    assert repo.authenticate("ql_" + "b" * 43) is None
