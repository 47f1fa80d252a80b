"""Schedules in the database: each slot decided once, the cursor only forward, delete cancels."""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, update

from app.domain.errors import NotFound, PreconditionFailed
from app.domain.model import ScheduleDefinition
from app.schedule.slots import jitter_ms, slot_jitter_ms
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from app.storage.schedules_repo import (
    FIRE_PAGE,
    ON_TIME_GRACE_MS,
    REFUSAL_RETRY_MS,
    ScheduleRepository,
    spec_of,
)
from app.storage.tables import runs, schedules
from tests.storage.helpers import define_task, start

T0 = 1_699_999_200_000  # a whole hour in the past: the tests pass their own clock, and a
# future one would push this process's uuid7 clock (monotonic) ahead for every later test


def every(seconds: int = 1, **kw: object) -> ScheduleDefinition:
    """An every-``seconds`` schedule of task ``job``."""
    return ScheduleDefinition(task="job", revision=None, cron=None, every_seconds=seconds, **kw)  # type: ignore[arg-type]


def make(engine: Engine, definition: ScheduleDefinition, name: str = "tick") -> ScheduleRepository:
    """Define the task and put the schedule at T0."""
    define_task(engine)
    repo = ScheduleRepository(engine)
    repo.put_schedule(name=name, definition=definition, paused=False, at_ms=T0)
    return repo


def slots_of_runs(engine: Engine) -> list[int]:
    """The slot of every run, ascending."""
    with engine.connect() as conn:
        return sorted(conn.execute(select(runs.c.slot_ms)).scalars())


def test_a_new_schedule_is_due_at_its_first_slot_after_now(engine: Engine) -> None:
    repo = make(engine, every(5))
    schedule = repo.get(name="tick")
    assert (schedule.cursor_ms, schedule.next_due_ms, schedule.version) == (T0, T0 + 5000, 1)
    assert repo.earliest_due_ms() == T0 + 5000


def test_each_due_slot_fires_one_run_with_its_trigger(engine: Engine) -> None:
    repo = make(engine, every(1, overlap="allow", max_concurrent=10))
    for second in range(1, 4):
        assert repo.fire_due(T0 + second * 1000).runs_created == 1
    assert slots_of_runs(engine) == [T0 + 1000, T0 + 2000, T0 + 3000]
    run = RunReader(engine).list_runs(task=None, status=None, limit=10, cursor=None).items[0]
    assert (run.trigger_kind, run.schedule, run.slot_ms) == ("schedule", "tick", T0 + 3000)
    decisions = repo.decisions(name="tick", limit=10, cursor=None).items
    assert [(d.decision, d.slot_ms) for d in decisions] == [
        ("fired", T0 + 3000), ("fired", T0 + 2000), ("fired", T0 + 1000)
    ]  # fmt: skip


def test_a_clock_set_back_fires_nothing_twice(engine: Engine) -> None:
    repo = make(engine, every(1, overlap="allow", max_concurrent=10))
    repo.fire_due(T0 + 3000)
    assert repo.fire_due(T0 + 1000).runs_created == 0
    assert repo.fire_due(T0 + 3000).runs_created == 0
    assert repo.get(name="tick").cursor_ms == T0 + 3000
    assert slots_of_runs(engine) == [T0 + 3000]


def test_catchup_latest_fires_the_newest_missed_slot_and_collapses_the_rest(engine: Engine) -> None:
    repo = make(engine, every(1, catchup="latest"))
    assert repo.fire_due(T0 + 10_000).runs_created == 1
    assert slots_of_runs(engine) == [T0 + 10_000]
    fired, missed = repo.decisions(name="tick", limit=10, cursor=None).items
    assert (fired.decision, fired.slot_ms) == ("fired", T0 + 10_000)
    assert (missed.decision, missed.count, missed.slot_ms, missed.until_slot_ms) == (
        "missed", 9, T0 + 1000, T0 + 9000
    )  # fmt: skip


def test_catchup_all_fires_every_missed_slot_in_order(engine: Engine) -> None:
    repo = make(engine, every(1, catchup="all", overlap="allow", max_concurrent=10))
    assert repo.fire_due(T0 + 5000).runs_created == 5
    assert slots_of_runs(engine) == [T0 + s * 1000 for s in range(1, 6)]


def test_catchup_all_under_skip_fires_the_oldest_and_skips_the_rest(engine: Engine) -> None:
    """docs/schedules.md §3: each caught-up slot is decided under the overlap policy, so the
    default ``skip`` keeps only the oldest missed slot's run (what the docs and the CLI's
    warning say), ``queue_one`` the two oldest, and ``replace`` ends on the newest, the older
    ones cancelled."""
    repo = make(engine, every(1, catchup="all"))
    assert repo.fire_due(T0 + 5000).runs_created == 1
    assert slots_of_runs(engine) == [T0 + 1000]
    decided = repo.decisions(name="tick", limit=10, cursor=None).items
    assert [(d.decision, d.slot_ms) for d in reversed(decided)] == [
        ("fired", T0 + 1000), *[("skipped_overlap", T0 + s * 1000) for s in range(2, 6)]
    ]  # fmt: skip

    repo = make(engine, every(1, catchup="all", overlap="queue_one"), name="pair")
    assert repo.fire_due(T0 + 5000).runs_created == 2
    decided = repo.decisions(name="pair", limit=10, cursor=None).items
    assert [d.decision for d in reversed(decided)] == ["fired", "queued", *["skipped_overlap"] * 3]

    repo = make(engine, every(1, catchup="all", overlap="replace"), name="swap")
    assert repo.fire_due(T0 + 5000).runs_created == 5
    with engine.connect() as conn:
        rows = conn.execute(
            select(runs.c.slot_ms, runs.c.status).where(runs.c.schedule_id == repo.get(name="swap").id)
        ).all()
    assert sorted(rows) == [
        *[(T0 + s * 1000, "cancelled") for s in range(1, 5)], (T0 + 5000, "queued")
    ]  # fmt: skip


def test_catchup_none_fires_no_missed_slot_but_the_one_due_now(engine: Engine) -> None:
    repo = make(engine, every(1, catchup="none"))
    assert repo.fire_due(T0 + 5000).runs_created == 1
    assert slots_of_runs(engine) == [T0 + 5000]
    fired, missed = repo.decisions(name="tick", limit=10, cursor=None).items
    assert (fired.decision, fired.slot_ms) == ("fired", T0 + 5000)
    assert (missed.count, missed.slot_ms, missed.until_slot_ms) == (4, T0 + 1000, T0 + 4000)
    assert repo.get(name="tick").next_due_ms == T0 + 6000


def test_catchup_none_fires_nothing_once_the_newest_slot_is_past_the_grace(
    engine: Engine,
) -> None:
    repo = make(engine, every(60, catchup="none"))
    late = T0 + 60_000 + ON_TIME_GRACE_MS + 1
    assert repo.fire_due(late).runs_created == 0
    assert repo.decisions(name="tick", limit=10, cursor=None).items[0].count == 1


def test_an_on_time_slot_fires_even_with_a_zero_catchup_window(engine: Engine) -> None:
    # plan_catchup alone would call a slot decided 300 ms late "missed" under a 0 s window.
    repo = make(engine, every(60, catchup="latest", catchup_window_seconds=0))
    assert repo.fire_due(T0 + 60_300).runs_created == 1
    assert slots_of_runs(engine) == [T0 + 60_000]


def test_each_decided_slot_reports_its_lateness_at_the_commit_and_whether_on_time(
    engine: Engine,
) -> None:
    # Down from T0 to T0 + 10 s under catch-up "all": slots 1..10 s all fire, each as late as
    # its age plus the transaction; within the 5 s grace they are on time, the rest backlog.
    repo = make(engine, every(1, catchup="all", overlap="allow", max_concurrent=20))
    result = repo.fire_due(T0 + 10_000)
    assert result.runs_created == 10
    got = sorted(result.lateness, key=lambda late: late.seconds)
    for age, late in zip(range(10), got, strict=True):
        assert age <= late.seconds < age + 2.0  # + the commit, on a loaded machine
        assert late.on_time == (age * 1000 <= ON_TIME_GRACE_MS)
    assert repo.fire_due(T0 + 10_000).lateness == ()  # nothing decided, nothing reported


def test_a_jittered_slot_is_late_from_its_jittered_instant(engine: Engine) -> None:
    # Every 20 s with up to 5 s of jitter: the second fire below (at most 11 s after its
    # slot) can never reach the slot after it, whatever jitter the schedule's id draws.
    repo = make(engine, every(20, jitter_seconds=5))
    slot = T0 + 20_000
    due = slot + jitter_ms(repo.get(name="tick").id, slot, 5)
    (late,) = repo.fire_due(due + 300).lateness
    assert 0.3 <= late.seconds < 2.3 and late.on_time
    # A skipped slot is decided too, and so reported.
    nxt = T0 + 40_000
    (skipped,) = repo.fire_due(nxt + jitter_ms(repo.get(name="tick").id, nxt, 5) + 6000).lateness
    assert 6.0 <= skipped.seconds < 8.0 and not skipped.on_time
    assert repo.decisions(name="tick", limit=1, cursor=None).items[0].decision == "skipped_overlap"


def test_overlap_skip_records_the_blocking_run(engine: Engine) -> None:
    repo = make(engine, every(1))
    repo.fire_due(T0 + 1000)
    blocker = RunReader(engine).list_runs(task=None, status=None, limit=1, cursor=None).items[0]
    start(engine, blocker)
    assert repo.fire_due(T0 + 2000).runs_created == 0
    skipped = repo.decisions(name="tick", limit=1, cursor=None).items[0]
    assert (skipped.decision, skipped.run_id, skipped.slot_ms) == (
        "skipped_overlap", blocker.id, T0 + 2000
    )  # fmt: skip


def test_overlap_allow_runs_up_to_max_concurrent(engine: Engine) -> None:
    repo = make(engine, every(1, overlap="allow", max_concurrent=2))
    created = [repo.fire_due(T0 + s * 1000).runs_created for s in range(1, 5)]
    assert created == [1, 1, 0, 0]


def test_a_change_never_fires_a_past_slot(engine: Engine) -> None:
    repo = make(engine, every(1))
    repo.put_schedule(name="tick", definition=every(2), paused=False, at_ms=T0 + 7500)
    schedule = repo.get(name="tick")
    assert (schedule.version, schedule.cursor_ms, schedule.next_due_ms) == (2, T0 + 7500, T0 + 8000)
    assert repo.fire_due(T0 + 8000).runs_created == 1
    assert slots_of_runs(engine) == [T0 + 8000]


def test_the_same_definition_is_not_a_change_and_a_stale_if_match_is_refused(
    engine: Engine,
) -> None:
    repo = make(engine, every(1))
    first = repo.get(name="tick")
    same, created = repo.put_schedule(name="tick", definition=every(1), paused=False, at_ms=T0 + 1)
    assert (created, same.version) == (False, 1)
    repo.put_schedule(name="tick", definition=every(3), paused=False, if_match=first.etag)
    with pytest.raises(PreconditionFailed):
        repo.put_schedule(name="tick", definition=every(4), paused=False, if_match=first.etag)


def test_pause_stops_the_fire_and_resume_catches_up_from_the_cursor(engine: Engine) -> None:
    repo = make(engine, every(1, catchup="latest"))
    repo.pause(name="tick")
    assert repo.get(name="tick").next_due_ms is None
    assert repo.fire_due(T0 + 5000).runs_created == 0
    assert repo.resume(name="tick").next_due_ms == T0 + 1000
    assert repo.fire_due(T0 + 5000).runs_created == 1
    assert slots_of_runs(engine) == [T0 + 5000]


def test_delete_cancels_the_schedules_queued_runs_in_the_same_transaction(engine: Engine) -> None:
    repo = make(engine, every(1, overlap="allow", max_concurrent=5))
    repo.fire_due(T0 + 1000)
    repo.fire_due(T0 + 2000)
    running = RunReader(engine).list_runs(task=None, status=None, limit=1, cursor=None).items[0]
    start(engine, running)
    assert repo.delete(name="tick") == 1
    statuses = sorted(
        r.status
        for r in RunReader(engine).list_runs(task=None, status=None, limit=10, cursor=None).items
    )
    assert statuses == ["cancelled", "running"]
    with pytest.raises(NotFound):
        repo.get(name="tick")


def test_two_concurrent_loops_fire_each_slot_exactly_once(db_url: str, engine: Engine) -> None:
    make(engine, every(1, catchup="all", overlap="allow", max_concurrent=1000))
    engines = [make_engine(db_url) for _ in range(2)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def loop(eng: Engine) -> None:
        try:
            repo = ScheduleRepository(eng)
            barrier.wait()
            for second in range(1, 41):
                repo.fire_due(T0 + second * 1000)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(e,)) for e in engines]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for e in engines:
            e.dispose()
    assert not errors
    assert slots_of_runs(engine) == [T0 + s * 1000 for s in range(1, 41)]


def test_jitter_delays_the_slot_by_the_same_amount_every_time(engine: Engine) -> None:
    repo = make(engine, every(10, jitter_seconds=5))
    schedule = repo.get(name="tick")
    slot = T0 + 10_000
    delay = jitter_ms(schedule.id, slot, 5)
    assert 0 <= delay < 5000
    assert schedule.next_due_ms == slot + delay
    if delay > 0:
        assert repo.fire_due(slot + delay - 1).runs_created == 0
        assert repo.get(name="tick").next_due_ms == slot + delay
    assert repo.fire_due(slot + delay).runs_created == 1
    assert slots_of_runs(engine) == [slot]
    after = repo.get(name="tick")
    assert after.next_due_ms == slot + 10_000 + jitter_ms(schedule.id, slot + 10_000, 5)


def test_a_slot_that_finds_the_queue_full_is_dropped_not_queued(engine: Engine) -> None:
    define_task(engine)
    repo = ScheduleRepository(engine, max_queued=2)
    repo.put_schedule(
        name="tick", definition=every(1, overlap="allow", max_concurrent=10), paused=False,
        at_ms=T0,
    )  # fmt: skip
    for second in range(1, 4):
        repo.fire_due(T0 + second * 1000)
    assert slots_of_runs(engine) == [T0 + 1000, T0 + 2000]  # the two the cap admits
    newest = repo.decisions(name="tick", limit=1, cursor=None).items[0]
    assert (newest.decision, newest.slot_ms, newest.run_id) == (
        "dropped_queue_full",
        T0 + 3000,
        None,
    )
    assert repo.get(name="tick").cursor_ms == T0 + 3000  # decided: never fired later


def test_a_backlog_under_a_jitter_longer_than_the_interval_fires_in_order_and_is_caught_up(
    engine: Engine,
) -> None:
    # Every minute, jitter up to 10 minutes (each slot's own is within its minute), down for
    # 20 minutes, catchup all: the backlog fires at once, every slot after its own jittered
    # instant (they fall due in order); on time only one whose instant fell within the grace.
    definition = every(60, catchup="all", overlap="allow", max_concurrent=50, jitter_seconds=600)
    repo = make(engine, definition)
    sid, at = repo.get(name="tick").id, T0 + 1_200_000
    spec = spec_of(definition)
    slots = [T0 + 60_000 * k for k in range(1, 21)]
    due = {s: s + slot_jitter_ms(spec, sid, s, 600) for s in slots}
    result = repo.fire_due(at)
    fired = slots_of_runs(engine)
    assert fired == [s for s, d in due.items() if d <= at] and len(fired) >= 19
    assert all(d < s + 60_000 for s, d in due.items())
    within_grace = [s for s in fired if at - due[s] <= ON_TIME_GRACE_MS]
    assert len([late for late in result.lateness if late.on_time]) == len(within_grace)


@pytest.mark.parametrize("late", [0, 20, 400])
def test_a_jitter_longer_than_the_interval_misses_no_slot_while_the_loop_keeps_up(
    engine: Engine, late: int
) -> None:
    """Every second with up to 10 s of jitter, catchup latest: a pass at each due instant,
    or ``late`` ms after it (under the half-second margin), fires each slot (a jitter past
    the next slot's instant made every pass take the slots still in their jitter for a
    backlog: 57 of 58 recorded missed on a real serve)."""
    repo = make(engine, every(1, jitter_seconds=10, overlap="allow", max_concurrent=100))
    for _ in range(60):
        due = repo.get(name="tick").next_due_ms
        assert due is not None
        repo.fire_due(due + late)
    decisions = repo.decisions(name="tick", limit=200, cursor=None).items
    assert {d.decision for d in decisions} == {"fired"}
    assert slots_of_runs(engine) == [T0 + 1000 * k for k in range(1, 61)]


def decided_slots(repo: ScheduleRepository, name: str, every_ms: int) -> list[int]:
    """Every slot the schedule's decisions cover, a missed span slot by slot, ascending."""
    covered: list[int] = []
    for d in repo.decisions(name=name, limit=200, cursor=None).items:
        if d.decision == "missed":
            assert d.until_slot_ms is not None
            covered += range(d.slot_ms, d.until_slot_ms + 1, every_ms)
        else:
            covered.append(d.slot_ms)
    return sorted(covered)


def test_a_pass_just_after_a_jittered_slot_and_the_next_slots_instant_fires_it(
    engine: Engine,
) -> None:
    """Every second, 1 s of jitter (half a second at most: the margin): a slot whose jitter is
    nearly that is due about half a second before the next slot's instant. A pass 525 ms after
    its due instant (the next instant has passed, its jitter has not) fired nothing and
    called the slot missed (the review of the jitter change); the next slot is held, not
    judged, and this one fires, on time within the grace."""
    definition = every(1, jitter_seconds=1, overlap="allow", max_concurrent=1000)
    repo = make(engine, definition)
    schedule, spec = repo.get(name="tick"), spec_of(definition)

    def jitter(slot: int) -> int:
        return slot_jitter_ms(spec, schedule.id, slot, 1)

    # The first slot meeting it (each second has about a 4 % chance; 500 give it almost surely).
    slot = next(
        T0 + 1000 * k for k in range(2, 500)
        if jitter(T0 + 1000 * k) >= 480 and jitter(T0 + 1000 * (k + 1)) > jitter(T0 + 1000 * k) - 475
    )  # fmt: skip
    while (due := repo.get(name="tick").next_due_ms) is not None and due < slot:
        repo.fire_due(due)  # every slot before it, each at its due instant
    at = slot + jitter(slot) + 525
    assert at > slot + 1000 and slot + 1000 + jitter(slot + 1000) > at
    repo.fire_due(at)
    decisions = repo.decisions(name="tick", limit=1000, cursor=None).items
    assert {d.decision for d in decisions} == {"fired"}
    assert slots_of_runs(engine)[-1] == slot
    assert repo.get(name="tick").next_due_ms == slot + 1000 + jitter(slot + 1000)


def test_a_late_pass_within_a_jitter_of_many_slots_leaves_no_slot_undecided(
    engine: Engine,
) -> None:
    # Every second with up to 60 s of jitter: the on-time reach (the grace plus the jitter)
    # holds dozens of slots. The on-time slot is the newest due one; a pass that took one
    # from the start of the reach moved the cursor past the slots after it, which no
    # decision ever covered (docs/schedules.md §2: every slot decided exactly once).
    definition = every(1, jitter_seconds=60, overlap="allow", max_concurrent=100)
    repo = make(engine, definition)
    name, schedule = "tick", repo.get(name="tick")
    ninth = T0 + 9000
    # Nine slots due, the ninth on time: a pass within its jitter (under 1 s, its interval).
    at = ninth + slot_jitter_ms(spec_of(definition), schedule.id, ninth, 60)
    assert repo.fire_due(at).schedules_decided == 1
    cursor = repo.get(name=name).cursor_ms
    assert cursor >= ninth
    assert decided_slots(repo, name, 1000) == list(range(T0 + 1000, cursor + 1, 1000))


def test_a_schedule_this_build_refuses_is_said_once_a_minute_not_every_pass(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # A body a newer build stored (a rollback): this build refuses it, the schedule stays
    # due and is tried again now and then, the others due behind it go on.
    repo = make(engine, every(1))
    make(engine, every(1), name="other")
    broken = repo.get(name="tick")
    with engine.begin() as conn:
        conn.execute(
            update(schedules).where(schedules.c.id == broken.id)
            .values(body='{"task": "job", "revision": null, "cron": ["99 * * * *"], "every_seconds": null}')
        )  # fmt: skip
    with caplog.at_level(logging.ERROR, logger="qinglong.schedules"):
        for n in range(1, 6):
            repo.fire_due(T0 + 1000 * n)
    refused = [m for m in caplog.messages if m.startswith("schedule fire refused")]
    assert refused == [f"schedule fire refused: INVALID_SCHEDULE (schedule {broken.id})"]
    assert repo.get(name="other").cursor_ms == T0 + 5000  # decided every pass meanwhile


NEWER_BODY = '{"task": "job", "revision": null, "cron": ["99 * * * *"], "every_seconds": null}'


def refuse(engine: Engine, *names: str) -> None:
    """Store a body this build refuses (as a newer build's would be) for each schedule."""
    with engine.begin() as conn:
        conn.execute(update(schedules).where(schedules.c.name.in_(names)).values(body=NEWER_BODY))


def test_refused_schedules_filling_the_due_page_do_not_starve_the_ones_behind_them(
    engine: Engine,
) -> None:
    # More refused schedules than a page, all due before a good one: each pass selected the
    # same page of refused ones and the good schedule never fired (the loop, seeing a full
    # page, passed again at once: a spin).
    repo = make(engine, every(1), name="r00")
    names = [f"r{n:02}" for n in range(FIRE_PAGE + 8)]
    for name in names[1:]:
        repo.put_schedule(name=name, definition=every(1), paused=False, at_ms=T0)
    repo.put_schedule(name="good", definition=every(2), paused=False, at_ms=T0)
    refuse(engine, *names)
    at = T0 + 2000
    passes = [repo.fire_due(at) for _ in range(3)]
    assert [p.schedules_decided for p in passes] == [0, 1, 0]
    assert [p.page_full for p in passes] == [True, False, False]
    assert repo.get(name="good").cursor_ms == T0 + 2000
    # Until their retry the refused ones are not due: the loop sleeps until then.
    assert repo.earliest_due_ms(at) == min(at + REFUSAL_RETRY_MS, T0 + 4000)


def test_a_refused_schedule_is_tried_again_after_its_retry_or_at_once_once_changed(
    engine: Engine, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make(engine, every(1))
    refuse(engine, "tick")
    tries: list[int] = []
    real_fire_one = repo._fire_one

    def fire_one(schedule_id: str, at: int, began: float) -> object:
        tries.append(at)
        return real_fire_one(schedule_id, at, began)

    monkeypatch.setattr(repo, "_fire_one", fire_one)
    with caplog.at_level(logging.ERROR, logger="qinglong.schedules"):
        assert repo.fire_due(T0 + 1000).schedules_decided == 0
        assert repo.earliest_due_ms(T0 + 1000) == T0 + 1000 + REFUSAL_RETRY_MS
        # The build that refused it cannot read it later either; the retry comes anyway
        # (an unreadable revision may be one that is only slow to come back).
        refused_at = T0 + 1000 + REFUSAL_RETRY_MS
        repo.fire_due(T0 + 1020)
        repo.fire_due(refused_at - 1)
        assert tries == [T0 + 1000]  # left out until its retry
        assert repo.fire_due(refused_at).schedules_decided == 0
        assert tries == [T0 + 1000, refused_at]
        assert repo.earliest_due_ms(refused_at) == refused_at + REFUSAL_RETRY_MS
        # A new version (a PUT from any api process) is read at the next pass.
        repo.put_schedule(name="tick", definition=every(2), paused=False, at_ms=refused_at)
        assert repo.fire_due(refused_at + 2000).schedules_decided == 1
    tried = [m for m in caplog.messages if m.startswith("schedule fire refused")]
    assert len(tried) == 1  # the second refusal is within the minute of the first line


def test_thousands_of_refused_schedules_are_left_out_in_python_not_bound_in_sql(
    engine: Engine,
) -> None:
    # A rollback can leave every schedule refused; each would be two bound parameters of a
    # NOT IN, past what a statement binds: 65535 with psycopg, 32766 in SQLite's default
    # build (this one's Python allows more: the test sets the default). The page still reads.
    def sqlite_default_limit(dbapi_conn: Any, *_: Any) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32766)

    repo = make(engine, every(1))
    repo.put_schedule(name="later", definition=every(5), paused=False, at_ms=T0)
    repo._refused.update({f"gone-{n}": (1, T0 + 60_000) for n in range(40_000)})
    event.listen(engine, "checkout", sqlite_default_limit)
    try:
        assert repo.fire_due(T0 + 1000).schedules_decided == 1
        assert repo.earliest_due_ms(T0 + 1000) == T0 + 2000
    finally:
        event.remove(engine, "checkout", sqlite_default_limit)


def test_catchup_all_past_100_slots_holds_a_newest_slot_still_in_its_jitter(
    engine: Engine,
) -> None:
    # Every second with up to 1 s of jitter, catchup all, down for over 150 slots: the pass
    # fires the 100 oldest and records the rest missed, but the newest slot, whose instant
    # has passed and whose jitter has not, is not due: it was counted in the missed range,
    # decided before it was due. It is held, then fires on time at its due instant.
    definition = every(1, catchup="all", overlap="allow", max_concurrent=1000, jitter_seconds=1)
    repo = make(engine, definition)
    spec, sid = spec_of(definition), repo.get(name="tick").id
    newest = next(
        T0 + 1000 * k for k in range(150, 400) if slot_jitter_ms(spec, sid, T0 + 1000 * k, 1) >= 100
    )
    repo.fire_due(newest + 50)
    decisions = repo.decisions(name="tick", limit=1000, cursor=None).items
    (missed,) = [d for d in decisions if d.decision == "missed"]
    assert (missed.slot_ms, missed.until_slot_ms) == (T0 + 101_000, newest - 1000)
    assert slots_of_runs(engine) == [T0 + 1000 * k for k in range(1, 101)]
    due = newest + slot_jitter_ms(spec, sid, newest, 1)
    assert (repo.get(name="tick").cursor_ms, repo.get(name="tick").next_due_ms) == (newest - 1, due)
    (on_time,) = repo.fire_due(due).lateness
    assert on_time.on_time and slots_of_runs(engine)[-1] == newest
