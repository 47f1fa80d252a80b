"""Schedule slots: intervals, bounds, unions, catch-up plans, jitter, local times, refusals.

docs/schedules-time.md. Expected values are worked out by hand from the rules there.
"""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.errors import ErrorCode, InvalidSchedule, InvalidTimezone, ValidationFailed
from app.schedule.slots import (
    CatchupPlan,
    SlotSpec,
    jitter_ms,
    last_slot,
    local_iso,
    next_slot,
    plan_catchup,
    slot_jitter_ms,
    slots_after,
    validate,
)

MIN = 60_000
HOUR = 3_600_000


def ms(utc: str) -> int:
    return int(dt.datetime.fromisoformat(utc.replace("Z", "+00:00")).timestamp() * 1000)


def cron(*exprs: str, tz: str = "UTC", **kw: object) -> SlotSpec:
    return SlotSpec(cron=exprs, every_seconds=None, timezone=tz, **kw)  # type: ignore[arg-type]


def every(seconds: int, **kw: object) -> SlotSpec:
    return SlotSpec(cron=None, every_seconds=seconds, **kw)  # type: ignore[arg-type]


T0 = ms("2026-01-01T00:00:00Z")


# -- every_seconds ------------------------------------------------------------------------------


def test_an_interval_is_aligned_to_the_epoch_not_to_the_first_question() -> None:
    assert slots_after(every(7), 1_000, 3) == [7_000, 14_000, 21_000]
    assert slots_after(every(7), 7_000, 2) == [14_000, 21_000]
    assert slots_after(every(3600), T0 + 1, 2) == [T0 + HOUR, T0 + 2 * HOUR]
    assert next_slot(every(1), T0 + 999) == T0 + 1000


def test_the_last_slot_is_the_newest_in_the_range_however_many_it_holds() -> None:
    assert last_slot(every(1), T0, T0 + 60_500) == T0 + 60_000
    assert last_slot(every(1), T0, T0 + 999) is None
    assert last_slot(every(1, end_at_ms=T0 + 5_000), T0, T0 + 60_000) == T0 + 5_000
    ny = cron("30 2 * * *", "0 * * * *", tz="America/New_York")
    assert last_slot(ny, ms("2026-03-07T00:00:00Z"), ms("2026-03-08T07:10:00Z")) == ms(
        "2026-03-08T07:00:00Z"
    )  # 02:30 shifts to 03:00-04:00, the slot 0 * * * * shares with it


def test_an_interval_ignores_the_time_zone_and_dst() -> None:
    spec = every(3600, timezone="America/New_York")
    day = slots_after(spec, ms("2026-03-08T04:59:59Z"), 24)
    assert day[0] == ms("2026-03-08T05:00:00Z")
    assert {b - a for a, b in itertools.pairwise(day)} == {HOUR}


@given(st.integers(1, 10**6), st.integers(-(10**12), 10**13))
@settings(max_examples=200)
def test_every_interval_slot_is_a_multiple_and_the_first_one_after(step: int, after: int) -> None:
    first, second = slots_after(every(step), after, 2)
    assert first % (step * 1000) == 0
    assert after < first <= after + step * 1000
    assert second - first == step * 1000


# -- bounds, union -------------------------------------------------------------------------------


def test_start_and_end_bound_the_slots_both_inclusive() -> None:
    spec = cron("0 * * * *", start_at_ms=T0 + 2 * HOUR, end_at_ms=T0 + 4 * HOUR)
    assert slots_after(spec, 0, 10) == [T0 + 2 * HOUR, T0 + 3 * HOUR, T0 + 4 * HOUR]
    assert slots_after(spec, T0 + 4 * HOUR, 10) == []
    assert next_slot(spec, T0 + 4 * HOUR) is None
    interval = every(3600, start_at_ms=T0 + HOUR + 1, end_at_ms=T0 + 3 * HOUR - 1)
    assert slots_after(interval, 0, 10) == [T0 + 2 * HOUR]


def test_a_union_of_expressions_fires_each_instant_once() -> None:
    spec = cron("0 * * * *", "*/30 * * * *", "0,30 0-1 * * *")
    assert slots_after(spec, T0 - 1, 5) == [
        T0,
        T0 + 30 * MIN,
        T0 + HOUR,
        T0 + 90 * MIN,
        T0 + 2 * HOUR,
    ]
    # 02:30 shifted out of the New York gap lands on 03:00, which the other expression has.
    ny = cron("30 2 * * *", "0 3 * * *", tz="America/New_York")
    assert slots_after(ny, ms("2026-03-08T00:00:00Z"), 2) == [
        ms("2026-03-08T07:00:00Z"),
        ms("2026-03-09T06:30:00Z"),
    ]


def test_day_of_month_and_day_of_week_are_ored_when_both_are_restricted() -> None:
    # 2026-01-01 is a Thursday: the 1st, 5th (Mon), 12th (Mon), 13th, 19th (Mon).
    got = slots_after(cron("0 0 1,13 * MON"), T0 - 1, 5)
    assert [dt.datetime.fromtimestamp(s / 1000, dt.UTC).day for s in got] == [1, 5, 12, 13, 19]
    # With the day of month a star, only Mondays.
    got = slots_after(cron("0 0 * * MON"), T0 - 1, 2)
    assert [dt.datetime.fromtimestamp(s / 1000, dt.UTC).day for s in got] == [5, 12]


@pytest.mark.parametrize(
    ("alias", "first_two"),
    [
        ("@hourly", ["2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"]),
        ("@daily", ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]),
        ("@weekly", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
        ("@monthly", ["2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"]),
        ("@yearly", ["2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"]),
        ("@annually", ["2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"]),
        ("@midnight", ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]),
    ],
)
def test_the_aliases_mean_their_cron_expressions(alias: str, first_two: list[str]) -> None:
    assert slots_after(cron(alias), T0 - 1, 2) == [ms(t) for t in first_two]


def test_reboot_is_refused_with_why_and_an_unknown_alias_lists_the_known_ones() -> None:
    with pytest.raises(InvalidSchedule) as caught:
        validate(cron("@reboot"))
    assert "no time to fire at" in caught.value.detail
    with pytest.raises(InvalidSchedule) as caught:
        validate(cron("@fortnightly"))
    assert "@annually" in caught.value.detail and "@midnight" in caught.value.detail


@pytest.mark.parametrize("line", ["CRON_TZ=Asia/Shanghai 0 7 * * *", "TZ=UTC 0 7 * * *"])
def test_a_crontab_zone_setting_before_the_fields_is_refused_naming_timezone(line: str) -> None:
    # Pasted from a crontab (cronie's CRON_TZ=), it read as 6 fields: "Bad second".
    with pytest.raises(InvalidSchedule) as caught:
        validate(cron(line))
    assert caught.value.detail == (
        "cron[0]: a crontab's CRON_TZ= or TZ= setting is not part of an expression: give the "
        "zone as the schedule's timezone (the CLI's --timezone) and the fields alone"
    )
    assert "Asia" not in caught.value.detail  # the zone sent is not repeated


def test_a_six_field_expression_has_seconds_first() -> None:
    assert slots_after(cron("*/15 * * * * *"), T0, 3) == [T0 + 15_000, T0 + 30_000, T0 + 45_000]


def test_an_expression_that_never_matches_gives_no_slot_instead_of_hanging() -> None:
    # Every minute of the 1st and 21st, if it is also the last Monday of the month.
    assert slots_after(cron("* * */20 * 1L"), T0, 3) == []


# -- catch-up ------------------------------------------------------------------------------------

# Two years down with a minutely schedule: 10**6 missed slots.
DOWN = 10**6 * MIN


def test_latest_fires_the_newest_missed_slot_and_collapses_the_rest() -> None:
    plan = plan_catchup(cron("* * * * *"), T0, T0 + DOWN, catchup="latest", window_s=3600)
    assert plan == CatchupPlan(
        fire=(T0 + DOWN,),
        missed_count=10**6 - 1,
        missed_first_ms=T0 + MIN,
        missed_last_ms=T0 + DOWN - MIN,
        cursor_ms=T0 + DOWN,
    )


def test_all_fires_the_first_hundred_in_order_and_collapses_the_rest() -> None:
    plan = plan_catchup(cron("* * * * *"), T0, T0 + DOWN, catchup="all", window_s=0)
    assert plan.fire == tuple(T0 + i * MIN for i in range(1, 101))
    assert plan.missed_count == 10**6 - 100
    assert plan.missed_first_ms == T0 + 101 * MIN
    assert plan.missed_last_ms == T0 + DOWN
    assert plan.cursor_ms == T0 + DOWN


def test_none_fires_nothing_and_records_every_slot_missed() -> None:
    plan = plan_catchup(cron("* * * * *"), T0, T0 + DOWN, catchup="none", window_s=3600)
    assert plan == CatchupPlan((), 10**6, T0 + MIN, T0 + DOWN, T0 + DOWN)


def test_an_interval_catch_up_over_two_years_is_counted_too() -> None:
    plan = plan_catchup(every(60), T0, T0 + DOWN + 59_999, catchup="all", window_s=0)
    assert plan.missed_count == 10**6 - 100
    assert plan.missed_last_ms == T0 + DOWN
    assert plan.cursor_ms == T0 + DOWN + 59_999


def test_latest_fires_nothing_when_the_newest_slot_is_older_than_the_window() -> None:
    now = T0 + 10 * HOUR + 30 * MIN
    plan = plan_catchup(cron("0 * * * *"), T0, now, catchup="latest", window_s=600)
    assert plan == CatchupPlan((), 10, T0 + HOUR, T0 + 10 * HOUR, now)
    # Exactly at the window's edge still fires.
    plan = plan_catchup(cron("0 * * * *"), T0, now, catchup="latest", window_s=1800)
    assert plan.fire == (T0 + 10 * HOUR,)
    assert plan.missed_count == 9


def test_a_single_due_slot_fires_with_nothing_missed() -> None:
    for policy in ("latest", "all"):
        plan = plan_catchup(every(60), T0, T0 + MIN + 5, catchup=policy, window_s=60)
        assert plan == CatchupPlan((T0 + MIN,), 0, None, None, T0 + MIN + 5)


def test_a_clock_set_back_plans_nothing_and_keeps_the_cursor() -> None:
    for policy in ("latest", "all", "none"):
        plan = plan_catchup(every(1), T0, T0 - HOUR, catchup=policy, window_s=3600)
        assert plan == CatchupPlan((), 0, None, None, T0)
        assert plan_catchup(every(1), T0, T0, catchup=policy, window_s=3600).cursor_ms == T0


def test_no_slot_due_moves_the_cursor_to_now() -> None:
    plan = plan_catchup(cron("0 0 * * *"), T0, T0 + HOUR, catchup="all", window_s=0)
    assert plan == CatchupPlan((), 0, None, None, T0 + HOUR)


def test_catch_up_stays_inside_start_and_end() -> None:
    spec = cron("0 * * * *", start_at_ms=T0 + 5 * HOUR, end_at_ms=T0 + 7 * HOUR)
    plan = plan_catchup(spec, T0, T0 + 20 * HOUR, catchup="none", window_s=0)
    assert (plan.missed_count, plan.missed_first_ms, plan.missed_last_ms) == (
        3,
        T0 + 5 * HOUR,
        T0 + 7 * HOUR,
    )


@pytest.mark.parametrize(
    "tz", ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Europe/Dublin"]
)
@pytest.mark.parametrize(("gap", "fold"), [("shift", "first"), ("skip", "both")])
def test_the_counted_missed_slots_equal_the_enumerated_ones_across_transitions(
    tz: str, gap: str, fold: str
) -> None:
    spec = cron(
        "*/30 * * * *", "30 2 * * *", "45 1 * * *", "15 2 * * 0", tz=tz, dst_gap=gap, dst_fold=fold
    )
    start, end = ms("2026-03-01T00:00:00Z"), ms("2026-04-15T00:00:00Z")
    listed = slots_after(spec, start, 10_000)
    listed = [s for s in listed if s <= end]
    plan = plan_catchup(spec, start, end, catchup="none", window_s=0)
    assert plan.missed_count == len(listed)
    assert (plan.missed_first_ms, plan.missed_last_ms) == (listed[0], listed[-1])
    plan = plan_catchup(spec, start, end, catchup="all", window_s=0)
    assert plan.fire == tuple(listed[:100])
    assert plan.missed_first_ms == listed[100]


def test_an_unknown_catch_up_policy_is_refused() -> None:
    with pytest.raises(InvalidSchedule):
        plan_catchup(every(1), T0, T0 + 1, catchup="some", window_s=0)
    with pytest.raises(InvalidSchedule):
        plan_catchup(every(1), T0, T0 + 1, catchup="latest", window_s=-1)


# -- jitter, local time --------------------------------------------------------------------------


def test_jitter_is_the_same_for_the_same_schedule_and_slot_and_stays_in_range() -> None:
    values = [jitter_ms("sched-1", T0 + i * MIN, 30) for i in range(2000)]
    assert values == [jitter_ms("sched-1", T0 + i * MIN, 30) for i in range(2000)]
    assert all(0 <= v < 30_000 for v in values)
    assert len(set(values)) > 1000
    assert max(values) > 25_000
    assert min(values) < 5_000
    assert jitter_ms("sched-1", T0, 30) != jitter_ms("sched-2", T0, 30) or jitter_ms(
        "sched-1", T0 + MIN, 30
    ) != jitter_ms("sched-2", T0 + MIN, 30)
    assert jitter_ms("sched-1", T0, 0) == 0
    assert all(jitter_ms("s", T0 + i, 1) < 1000 for i in range(100))


def test_a_slots_jitter_stays_within_its_own_interval_so_slots_fall_due_in_order() -> None:
    # Shorter than every interval: exactly jitter_ms (schedules keep their instants).
    slots = [T0 + i * MIN for i in range(500)]
    assert [slot_jitter_ms(every(60), "s", t, 30) for t in slots] == [
        jitter_ms("s", t, 30) for t in slots
    ]
    # Ten minutes of jitter on an every-minute schedule: spread over the slot's own minute but
    # its last second, so two due instants are a second apart at least.
    values = [slot_jitter_ms(every(60), "s", t, 600) for t in slots]
    assert all(0 <= v < MIN - 1000 for v in values) and max(values) > 50_000 and min(values) < 10_000
    dues = [t + v for t, v in zip(slots, values, strict=True)]
    assert all(b - a > 1000 for a, b in itertools.pairwise(dues))
    # Every second: within the first half of the slot's second, dues half a second apart.
    halves = [slot_jitter_ms(every(1), "s", T0 + 1000 * i, 10) for i in range(500)]
    assert max(halves) < 500 < max(halves) + 20
    # Irregular cron gaps (9:00 and 9:10, then the next day): each slot's own gap bounds it.
    spec = cron("0,10 9 * * *")
    firsts = slots_after(spec, T0, 200)
    for first, second in itertools.pairwise(firsts):
        assert 0 <= slot_jitter_ms(spec, "s", first, 3600) < second - first - 1000
    # The last slot of a bounded schedule keeps the whole jitter.
    last = every(60, end_at_ms=T0 + MIN)
    assert slot_jitter_ms(last, "s", T0 + MIN, 600) == jitter_ms("s", T0 + MIN, 600)
    assert slot_jitter_ms(every(60), "s", T0, 0) == 0


def test_local_iso_gives_the_zone_s_wall_time_and_its_offset() -> None:
    assert local_iso("America/New_York", ms("2027-03-14T07:00:00Z")) == "2027-03-14T03:00:00-04:00"
    assert local_iso("America/New_York", ms("2027-03-14T06:59:00Z")) == "2027-03-14T01:59:00-05:00"
    assert local_iso("UTC", T0) == "2026-01-01T00:00:00+00:00"
    assert (
        local_iso("Australia/Lord_Howe", ms("2026-10-03T15:30:00Z")) == "2026-10-04T02:30:00+11:00"
    )
    assert local_iso("Asia/Shanghai", T0 + 1_500) == "2026-01-01T08:00:01.500+08:00"


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "said"),
    [
        ("61 * * * *", "cron[0]: Bad minute (its values: 0-59; "),
        ("* 25 * * *", "cron[0]: Bad hour (its values: 0-23; "),
        ("* * * 13 *", "cron[0]: Bad month (its values: 1-12 or jan-dec; "),
        ("* * * * 8", "cron[0]: Bad day-of-week (its values: 0-7 or sun-sat, 0 and 7 both Sunday; "),
        ("0 0 32 * *", "cron[0]: Bad day-of-month (its values: 1-31 or L; "),
        # A day every month lacks: not "its values", which would hold 31.
        ("0 0 31 2 *", "cron[0]: Bad day-of-month: none of its months has that day "),
        ("0 0 31 4,6 *", "cron[0]: Bad day-of-month: none of its months has that day "),
    ],
)
def test_a_bad_cron_field_is_refused_with_what_it_may_hold(expr: str, said: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        validate(cron(expr))
    assert caught.value.detail.startswith(said), caught.value.detail


@pytest.mark.parametrize(
    ("expr", "said"),
    [
        # Each was taken and fired only at its field's first value: */1000 once an hour.
        ("*/1000 * * * *", "a minute step must be 1 to 59"),
        ("*/60 * * * *", "a minute step must be 1 to 59"),
        ("0 */24 * * *", "an hour step must be 1 to 23"),
        ("0 0 */32 * *", "a day-of-month step must be 1 to 30"),
        ("0 0 * 1-6/13 *", "a month step over 1-6 must be 1 to 5"),
        ("0 0 * * */8", "a day-of-week step must be 1 to 6"),
        ("*/60 * * * * *", "a second step must be 1 to 59"),
        ("0 1,5/100 * * *", "an hour step over 5 must be 1 to 18"),
        # A step as wide as what it steps over matches its start only, too (a review).
        ("0 0 */31 * *", "a day-of-month step must be 1 to 30"),
        ("0 0 1 */12 *", "a month step must be 1 to 11"),
        ("0 0 * * */7", "a day-of-week step must be 1 to 6"),
        ("0 0 * * 1-5/7", "a day-of-week step over 1-5 must be 1 to 4"),
        # A step of 0 was refused as a bad field already; now the detail names the step.
        ("*/0 * * * *", "a minute step must be 1 to 59"),
        ("0 0 * * MON-FRI/0", "a day-of-week step must be 1 to 6"),
    ],
)
def test_a_step_past_its_fields_range_is_refused_naming_the_field(expr: str, said: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        validate(cron("0 3 * * *", expr))
    assert caught.value.detail.startswith(f"cron[1]: {said}"), caught.value.detail


def test_the_largest_step_of_each_field_is_taken() -> None:
    # Each matches two values at least: the start and one step on.
    validate(cron("*/59 */23 */30 */11 */6", "*/59 0 0 1 1 *", "0 0 1-31/30 1-12/11 1-7/6"))


def test_a_schedule_stored_with_a_step_past_its_range_still_has_its_slots() -> None:
    # Refused for a new schedule (validate); one stored before the check fires as it did.
    with pytest.raises(InvalidSchedule):
        validate(cron("*/1000 * * * *"))
    assert slots_after(cron("*/1000 * * * *"), 0, 2) == [3_600_000, 7_200_000]


@pytest.mark.parametrize(
    "spec",
    [
        SlotSpec(cron=None, every_seconds=None),
        SlotSpec(cron=("* * * * *",), every_seconds=60),
        SlotSpec(cron=(), every_seconds=None),
        SlotSpec(cron=("* * * * *",) * 9, every_seconds=None),
        SlotSpec(cron="* * * * *", every_seconds=None),  # type: ignore[arg-type]
        cron("61 * * * *"),
        cron("* * * *"),
        cron("* * * * * * *"),
        cron("0 0 30 2 *"),
        cron("@reboot"),
        cron(""),
        cron("* * * * * ", "nonsense"),
        every(0),
        every(True),  # type: ignore[arg-type]
        cron("* * * * *", dst_gap="later"),
        cron("* * * * *", dst_fold="second"),
        cron("* * * * *", start_at_ms=10, end_at_ms=5),
        cron("* * * * *", start_at_ms=-1),
        every(60, end_at_ms=10**18),
    ],
)
def test_a_bad_schedule_is_refused_with_invalid_schedule(spec: SlotSpec) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        validate(spec)
    assert caught.value.code is ErrorCode.INVALID_SCHEDULE
    assert isinstance(caught.value, ValidationFailed)  # 422 (app/api/problems.py)
    with pytest.raises(InvalidSchedule):
        slots_after(spec, 0, 1)


@pytest.mark.parametrize(
    "name", ["Mars/Olympus_Mons", "", "../etc/passwd", "/etc/localtime", "UTC "]
)
def test_an_unknown_time_zone_is_refused_with_invalid_timezone(name: str) -> None:
    with pytest.raises(InvalidTimezone) as caught:
        validate(cron("0 * * * *", tz=name))
    assert caught.value.code is ErrorCode.INVALID_TIMEZONE
    assert isinstance(caught.value, ValidationFailed)
    with pytest.raises(InvalidTimezone):
        local_iso(name, 0)


@pytest.mark.parametrize(
    "name", ["localtime", "posixrules", "right/UTC", "posix/Asia/Shanghai", "Factory"]
)
def test_a_zone_file_that_is_no_iana_zone_is_refused_for_a_new_schedule(name: str) -> None:
    try:
        ZoneInfo(name)  # loads: only the IANA check can refuse it
    except (ZoneInfoNotFoundError, ValueError, OSError):
        pytest.skip(f"this host's zoneinfo has no {name}")
    with pytest.raises(InvalidTimezone) as caught:
        validate(cron("0 * * * *", tz=name))
    assert "not an IANA zone" in str(caught.value)
    validate(cron("0 * * * *", tz="Etc/GMT+5"))  # an IANA name that is no place


def test_a_schedule_stored_with_such_a_zone_still_has_its_slots() -> None:
    # Factory ships with the tzdata package on every host; validate refuses it for a new
    # schedule, while the slots of one stored before the check are computed as ever.
    with pytest.raises(InvalidTimezone):
        validate(cron("0 * * * *", tz="Factory"))
    assert slots_after(cron("0 * * * *", tz="Factory"), 0, 2) == [3_600_000, 7_200_000]


def test_the_refusal_of_a_time_zone_never_repeats_it() -> None:
    with pytest.raises(InvalidTimezone) as caught:
        validate(cron("0 * * * *", tz="S3CRET-PLAINTEXT"))
    assert "S3CRET" not in str(caught.value) and "IANA" in str(caught.value)


def test_instants_far_outside_the_calendar_give_answers_not_overflows() -> None:
    # Clamped to 1900-01-01T00:00Z, then strictly after it.
    assert slots_after(every(60), -(10**18), 1) == [-2_208_988_800_000 + 60_000]
    assert slots_after(cron("0 0 1 1 *"), -(10**18), 1) == [ms("1901-01-01T00:00:00Z")]
    assert slots_after(cron("0 * * * *"), 10**18, 1) == []
    plan = plan_catchup(every(1), -(10**18), T0, catchup="latest", window_s=60)
    assert plan.fire == (T0,)
    assert plan.missed_first_ms == -2_208_988_800_000 + 1000
    with pytest.raises(InvalidSchedule):
        local_iso("UTC", 10**18)


def test_a_cursor_decades_old_is_planned_from_a_count_not_a_walk() -> None:
    plan = plan_catchup(cron("* * * * *", tz="Europe/Berlin"), 0, T0, catchup="all", window_s=0)
    assert plan.missed_count == T0 // MIN - 100
    assert plan.fire[0] == MIN
    assert plan.missed_last_ms == T0
    # Every second for two years, four transition days among them.
    two_years = ms("2028-01-01T00:00:00Z")
    spec = cron("* * * * * *", tz="Europe/Berlin")
    plan = plan_catchup(spec, T0, two_years, catchup="latest", window_s=1)
    assert plan.fire == (two_years,)
    assert plan.missed_count == (two_years - T0) // 1000 - 1
    assert plan.missed_last_ms == two_years - 1000


def test_valid_schedules_pass_validation() -> None:
    validate(
        cron("0 2 * * *", "*/5 9-17 * * MON-FRI", "0 0 L * *", "0 0 * * 5#2", tz="Asia/Shanghai")
    )
    validate(every(1, timezone="Europe/Dublin", start_at_ms=0, end_at_ms=0))


def test_the_zones_load_from_the_tzdata_package_without_a_system_database() -> None:
    import zoneinfo

    before = zoneinfo.TZPATH
    zoneinfo.reset_tzpath(to=[])
    try:
        tz = zoneinfo.ZoneInfo.no_cache("Australia/Lord_Howe")
        assert dt.datetime(2026, 10, 4, 3, tzinfo=tz).utcoffset() == dt.timedelta(hours=11)
    finally:
        zoneinfo.reset_tzpath(to=before)
