"""The worker's spawn record and T2 in one transaction (docs/design.md §3.7), on both engines
(``RunRepository.record_spawned_running``; the real worker's side is in
test_worker_process.py and tests/recovery/test_api_crash.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

from app.domain.artifacts import receipt_relpath
from app.domain.errors import ErrorCode, InvalidTransition
from app.storage.journal_repo import SPAWNED, AlreadyReserved, JournalRepository, NotStarting
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tables import attempts, receipt_journal
from tests.storage.helpers import HANDLE
from tests.worker.kit import Armed, armed_run, events


def _reserved(engine: Engine) -> Armed:
    armed = armed_run(engine)
    JournalRepository(engine).reserve(
        attempt_id=armed.attempt_id, run_id=armed.run_id,
        receipt_ref=receipt_relpath(armed.attempt_id), only_if_starting=True,
    )  # fmt: skip
    return armed


def _stored(engine: Engine, armed: Armed) -> tuple[str, str | None, str | None]:
    with engine.connect() as conn:
        entry = conn.execute(
            select(receipt_journal.c.state, receipt_journal.c.handle).where(
                receipt_journal.c.attempt_id == armed.attempt_id
            )
        ).one()
        handle = conn.execute(
            select(attempts.c.handle).where(attempts.c.id == armed.attempt_id)
        ).scalar_one()
    return entry.state, entry.handle, handle


def _record(runs: RunRepository, armed: Armed) -> str:
    """The worker's call, the shim having reported the job's start at 1234."""
    return runs.record_spawned_running(
        run_id=armed.run_id, attempt_id=armed.attempt_id, handle=HANDLE, started_at_ms=1234
    )


def test_the_spawn_record_and_t2_commit_together(engine: Engine) -> None:
    armed = _reserved(engine)
    runs = RunRepository(engine)
    before = [e.type for e in events(engine, armed.run_id)]
    written = _record(runs, armed)
    assert written == "running"
    state, journal_handle, attempt_handle = _stored(engine, armed)
    assert state == SPAWNED and journal_handle == attempt_handle is not None
    run = RunReader(engine).get_run(armed.run_id)
    assert run.status == "running" and run.started_at_ms == 1234  # the shim's start time
    assert run.latest_attempt is not None and run.latest_attempt.status == "running"
    after = [e.type for e in events(engine, armed.run_id)]
    assert after == [*before, "attempt.running", "run.running"]  # as the api's T2 wrote them
    # The api's T2, were it still sent, is refused: there is exactly one.
    with pytest.raises(InvalidTransition):
        runs.record_running(
            run_id=armed.run_id, attempt_id=armed.attempt_id, handle=HANDLE, started_at_ms=1
        )


def test_a_refused_t2_leaves_the_spawn_record_alone(engine: Engine) -> None:
    armed = _reserved(engine)
    runs = RunRepository(engine)
    # The start ended meanwhile (the coordinator gave up on it): T2 is refused, the journal
    # still learns the handle, so recovery stops that exact process.
    runs.fail_attempt(
        run_id=armed.run_id, attempt_id=armed.attempt_id,
        error_code=ErrorCode.EXECUTOR_START_FAILED,
    )  # fmt: skip
    before = [e.type for e in events(engine, armed.run_id)]
    written = _record(runs, armed)
    assert written == "spawned"
    state, journal_handle, attempt_handle = _stored(engine, armed)
    assert state == SPAWNED and journal_handle is not None and attempt_handle is None
    assert [e.type for e in events(engine, armed.run_id)] == before  # no T2 event


def test_an_entry_not_reserved_writes_nothing(engine: Engine) -> None:
    armed = _reserved(engine)
    journal = JournalRepository(engine)
    assert journal.mark_fenced(attempt_id=armed.attempt_id)  # recovery took the attempt
    runs = RunRepository(engine)
    before = [e.type for e in events(engine, armed.run_id)]
    run_before = RunReader(engine).get_run(armed.run_id)
    written = _record(runs, armed)
    assert written == "not_reserved"
    state, journal_handle, attempt_handle = _stored(engine, armed)
    assert (state, journal_handle, attempt_handle) == ("fenced", None, None)
    assert [e.type for e in events(engine, armed.run_id)] == before
    # T2 (written with the journal's move in one statement on PostgreSQL) was rolled back.
    run = RunReader(engine).get_run(armed.run_id)
    assert (run.status, run.version) == (run_before.status, run_before.version)
    assert run.status == "dispatching"
    assert run.latest_attempt is not None and run.latest_attempt.status == "starting"


def test_an_owned_reserve_stamps_the_attempt_with_its_instance_and_epoch(engine: Engine) -> None:
    # On PostgreSQL the reserve and the stamp are one statement (journal_repo
    # ``_RESERVE_AND_STAMP``); on SQLite two. Both: stamped once, never for a refused reserve.
    armed = armed_run(engine)
    journal = JournalRepository(engine, owner=lambda: ("inst-1", 7))
    ref = receipt_relpath(armed.attempt_id)
    entry = journal.reserve(
        attempt_id=armed.attempt_id, run_id=armed.run_id, receipt_ref=ref, only_if_starting=True
    )
    assert entry.state == "reserved"
    query = select(attempts.c.worker_instance_id, attempts.c.lease_epoch, attempts.c.status)
    with engine.connect() as conn:
        row = conn.execute(query.where(attempts.c.id == armed.attempt_id)).one()
        stored = conn.execute(
            select(receipt_journal.c.worker_instance_id).where(
                receipt_journal.c.attempt_id == armed.attempt_id
            )
        ).scalar_one()
    assert tuple(row) == ("inst-1", 7, "starting") and stored == "inst-1"
    with pytest.raises(AlreadyReserved):
        JournalRepository(engine, owner=lambda: ("inst-1", 8)).reserve(
            attempt_id=armed.attempt_id, run_id=armed.run_id, receipt_ref=ref,
            only_if_starting=True,
        )  # fmt: skip
    with engine.connect() as conn:
        assert conn.execute(
            select(attempts.c.lease_epoch).where(attempts.c.id == armed.attempt_id)
        ).scalar_one() == 7  # the refused reserve stamped nothing

    queued, _ = RunRepository(engine).enqueue_run(task="job", revision=1, priority=None)
    assert queued.latest_attempt is not None
    claimed = queued.latest_attempt.id  # not starting: no T1
    with pytest.raises(NotStarting):
        journal.reserve(
            attempt_id=claimed, run_id=queued.id, receipt_ref=receipt_relpath(claimed),
            only_if_starting=True,
        )  # fmt: skip
    with engine.connect() as conn:
        assert conn.execute(
            select(attempts.c.lease_epoch).where(attempts.c.id == claimed)
        ).scalar_one() is None
    assert journal.get(claimed) is None
