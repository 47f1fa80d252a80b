"""An existing 0004 database with rows upgrades through 0005 → 0006 → 0007 and keeps working.

The schema test (tests/integration/test_schema.py) migrates empty databases; this one fills a
0004 database the way 0004's code wrote it (a revision body without ``retry``, a queued, a
running and a succeeded run with their attempts, events and journal rows), upgrades it to
head on SQLite and on PostgreSQL, and drives the new code over the old rows: the queued run
is a dispatch candidate (not waiting, not held, not pinned), the old body means no retry, the
running run ends once, the old log is a retention candidate and expires.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, MetaData, Table, insert, select

from app.domain.canonical import canonical_json, content_digest
from app.domain.ids import now_ms, uuid7
from app.domain.model import revision_body
from app.storage.engine import make_engine
from app.storage.migrate import (
    alembic_config,
    current_revision,
    foreign_keys_deferred,
    head_revision,
    upgrade_to_head,
)
from app.storage.retention_repo import RetentionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tables import attempts, task_revisions
from tests.conftest import private_pg_schema
from tests.storage.helpers import HANDLE, TOKEN, start


def migrate_to(engine: Engine, revision: str, step: Any = command.upgrade) -> None:
    """Alembic's ``step`` (``command.upgrade`` or ``command.downgrade``) to ``revision``."""
    config = alembic_config()
    with engine.connect() as conn, foreign_keys_deferred(conn):  # as `qinglong migrate` does
        config.attributes["connection"] = conn
        step(config, revision)
        conn.commit()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on an empty database (nothing migrated)."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
        try:
            yield engine
        finally:
            engine.dispose()
        return
    with private_pg_schema("ql_upgrade", migrate=False) as url:
        engine = make_engine(url)
        try:
            yield engine
        finally:
            engine.dispose()


def _fill_0004(engine: Engine) -> dict[str, Any]:
    """Rows as 0004's code wrote them (only 0004's columns exist: reflected tables)."""
    # task_revisions is the same in 0004 (a body without ``retry``); the row is written as
    # put_revision writes it, without its read of task_archive (0015), absent here.
    body = revision_body(executor="local_process", argv=["/bin/true"], cwd=None, recipe=None,
                         timeout_seconds=None, priority=0)  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(task_revisions).values(
            task="job", revision=1, digest=content_digest(body), executor="local_process",
            body=canonical_json(body).decode("utf-8"), recipe_id=None, timeout_seconds=None,
            priority=0, created_at_ms=now_ms(),
        ))  # fmt: skip
    meta = MetaData()
    t = {n: Table(n, meta, autoload_with=engine) for n in ("runs", "attempts", "run_events")}
    journal = Table("receipt_journal", meta, autoload_with=engine)
    at = now_ms() - 10 * 86_400_000  # ten days old: past any keep_days of the test
    ids: dict[str, Any] = {}
    rows = {"queued": ("queued", "claimed"), "running": ("running", "running"),
            "succeeded": ("succeeded", "succeeded")}  # fmt: skip
    with engine.begin() as conn:
        for n, (name, (run_status, attempt_status)) in enumerate(rows.items()):
            run_id, attempt_id = uuid7(at + n), uuid7(at + n)
            ids[name] = (run_id, attempt_id)
            started = None if name == "queued" else at + n
            conn.execute(t["runs"].insert().values(
                id=run_id, task="job", revision=1, status=run_status, priority=0,
                version=1 if name == "queued" else 3, latest_attempt=1, created_at_ms=at + n,
                started_at_ms=started, finished_at_ms=at + n + 5 if name == "succeeded" else None,
                trigger_kind="manual",
            ))  # fmt: skip
            conn.execute(t["attempts"].insert().values(
                id=attempt_id, run_id=run_id, number=1, status=attempt_status,
                executor="local_process", created_at_ms=at + n, started_at_ms=started,
                finished_at_ms=at + n + 5 if name == "succeeded" else None,
                exit_code=0 if name == "succeeded" else None, callback_sequence=0,
                callback_token_digest=None,
                log_artifact_id=None if name == "queued" else f"log:{attempt_id}",
                log_bytes=10 if name == "succeeded" else None,
                handle=None if name == "queued" else json.dumps(HANDLE.to_dict()),
            ))  # fmt: skip
            events = ["run.queued"] + (
                [] if name == "queued" else ["run.dispatching", "run.running"]
            )
            for seq, kind in enumerate(events, start=1):
                conn.execute(t["run_events"].insert().values(
                    run_id=run_id, seq=seq, type=kind, at_ms=at + n, data="{}"
                ))  # fmt: skip
            if name != "queued":
                conn.execute(journal.insert().values(
                    attempt_id=attempt_id, run_id=run_id,
                    state="consumed" if name == "succeeded" else "spawned",
                    receipt_ref=f"x/{attempt_id}", created_at_ms=at, updated_at_ms=at,
                ))  # fmt: skip
    return ids


def test_a_populated_0004_database_upgrades_to_head_and_works(empty_engine: Engine) -> None:
    engine = empty_engine
    migrate_to(engine, "0004")
    assert current_revision(engine) == "0004"
    ids = _fill_0004(engine)

    upgrade_to_head(engine)  # 0005 → 0006 → 0007 over the rows
    assert current_revision(engine) == head_revision()

    reader = RunReader(engine)
    for name, status in (("queued", "queued"), ("running", "running"), ("succeeded", "succeeded")):
        run = reader.get_run(ids[name][0])
        assert (run.status, run.attempts, run.next_attempt_at_ms) == (status, 1, None)
        assert run.pinned is False
    with engine.connect() as conn:
        states = conn.execute(select(attempts.c.log_state, attempts.c.not_before_ms)).all()
    assert set(states) == {(None, None)}

    # The old queued run is a candidate: not waiting for a retry, not held.
    candidates = reader.dispatch_candidates(limit=4).items
    assert [c.run_id for c in candidates] == [ids["queued"][0]]
    assert candidates[0].held is False
    queued = start(engine, reader.get_run(ids["queued"][0]))
    assert queued.latest_attempt is not None
    # The old body names no retry: a failure ends the run (one attempt, no retry event).
    repo = RunRepository(engine)
    outcome = repo.complete_attempt(
        run_id=queued.id, attempt_id=queued.latest_attempt.id, token=TOKEN,
        callback_sequence=1, exit_code=3, signal=None, finished_at_ms=now_ms(),
    )  # fmt: skip
    assert (outcome.status, outcome.run_status) == ("applied", "failed")
    assert "run.retry_scheduled" not in [e.type for e in reader.list_events(queued.id).items]

    # The old succeeded run's log is a retention candidate and expires; pins work on old rows.
    retention = RetentionRepository(engine)
    old_log = ids["succeeded"][1]
    assert old_log in [c.attempt_id for c in retention.log_candidates("job", limit=8)]
    retention.set_pinned(ids["running"][0], True)
    assert reader.get_run(ids["running"][0]).pinned is True
    assert retention.mark_expiring([old_log]) == [old_log]
    assert retention.mark_expired([old_log]) == 1
    assert retention.figures().logs_expired == 1
