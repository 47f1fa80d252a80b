"""Golden DST tables for schedule slots over 2026-2027 (docs/schedules-time.md §2, §3).

Every expected instant was worked out by hand from the zones' known transitions (checked
against zoneinfo in test_the_transition_dates_the_tables_rely_on_are_the_zone_database_s),
never by running app.schedule.slots.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from zoneinfo import ZoneInfo

import pytest

from app.schedule.slots import SlotSpec, local_iso, slots_after

NY, BERLIN, LORD_HOWE, DUBLIN, SHANGHAI = (
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Europe/Dublin",
    "Asia/Shanghai",
)
ZONES = (NY, BERLIN, LORD_HOWE, DUBLIN, SHANGHAI)
BEIRUT = "Asia/Beirut"


def ms(utc: str) -> int:
    return int(dt.datetime.fromisoformat(utc.replace("Z", "+00:00")).timestamp() * 1000)


def iso(at_ms: int) -> str:
    return dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fires_on(zone: str, cron: tuple[str, ...], day: str, gap: str = "shift", fold: str = "first"):
    """UTC instants of the slots whose local date (by zoneinfo) is ``day``."""
    local_day = dt.date.fromisoformat(day)
    start = ms(f"{day}T00:00:00Z") - 2 * 86_400_000
    spec = SlotSpec(
        cron=cron, every_seconds=None, timezone=zone, dst_gap=gap, dst_fold=fold,
        end_at_ms=start + 4 * 86_400_000,
    )  # fmt: skip
    out = []
    for slot in slots_after(spec, start, 2000):
        d = dt.datetime.fromtimestamp(slot / 1000, ZoneInfo(zone)).date()
        if d > local_day:
            break
        if d == local_day:
            out.append(iso(slot))
    return out


# (zone, local date, old offset -> new offset at the transition) from the tz rules:
# US second Sunday of March / first Sunday of November at 02:00; EU last Sunday of March /
# October at 01:00 UTC; Lord Howe first Sunday of April / October at 02:00, 30 minutes.
TRANSITIONS = [
    (NY, "2026-03-08", -5 * 60, -4 * 60),
    (NY, "2026-11-01", -4 * 60, -5 * 60),
    (NY, "2027-03-14", -5 * 60, -4 * 60),
    (NY, "2027-11-07", -4 * 60, -5 * 60),
    (BERLIN, "2026-03-29", 60, 120),
    (BERLIN, "2026-10-25", 120, 60),
    (BERLIN, "2027-03-28", 60, 120),
    (BERLIN, "2027-10-31", 120, 60),
    (DUBLIN, "2026-03-29", 0, 60),
    (DUBLIN, "2026-10-25", 60, 0),
    (DUBLIN, "2027-03-28", 0, 60),
    (DUBLIN, "2027-10-31", 60, 0),
    (LORD_HOWE, "2026-04-05", 660, 630),
    (LORD_HOWE, "2026-10-04", 630, 660),
    (LORD_HOWE, "2027-04-04", 660, 630),
    (LORD_HOWE, "2027-10-03", 630, 660),
    # Beirut changes at midnight: the October fold is 23:00-24:00 of the day before.
    (BEIRUT, "2026-03-29", 120, 180),
    (BEIRUT, "2026-10-24", 180, 120),
]


@pytest.mark.parametrize(("zone", "day", "before", "after"), TRANSITIONS)
def test_the_transition_dates_the_tables_rely_on_are_the_zone_database_s(
    zone: str, day: str, before: int, after: int
) -> None:
    tz = ZoneInfo(zone)
    d = dt.date.fromisoformat(day)
    start = dt.datetime(d.year, d.month, d.day, tzinfo=tz)
    end = start + dt.timedelta(days=1)
    assert start.utcoffset() == dt.timedelta(minutes=before)
    assert end.utcoffset() == dt.timedelta(minutes=after)


def test_shanghai_has_no_transition_in_2026_or_2027() -> None:
    tz = ZoneInfo(SHANGHAI)
    offsets = {
        dt.datetime(2026, 1, 1, tzinfo=dt.UTC).astimezone(tz).utcoffset() for _ in range(1)
    } | {
        (dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=h)).astimezone(tz).utcoffset()
        for h in range(0, 2 * 365 * 24, 6)
    }
    assert offsets == {dt.timedelta(hours=8)}


# A fixed local time: zone, expression, policy, local day, the instants (UTC) that day.
FIXED = [
    # Spring forward: 02:30 does not exist; shift fires at the first instant after the gap.
    (NY, "30 2 * * *", "shift", "first", "2026-03-08", ["2026-03-08T07:00:00Z"]),
    (NY, "30 2 * * *", "skip", "first", "2026-03-08", []),
    (NY, "30 2 * * *", "shift", "first", "2027-03-14", ["2027-03-14T07:00:00Z"]),
    (NY, "30 2 * * *", "skip", "both", "2027-03-14", []),
    # Fall back: 01:00-02:00 repeats in New York, 02:30 does not.
    (NY, "30 1 * * *", "shift", "first", "2026-11-01", ["2026-11-01T05:30:00Z"]),
    (
        NY,
        "30 1 * * *",
        "shift",
        "both",
        "2026-11-01",
        ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"],
    ),
    (NY, "30 2 * * *", "shift", "both", "2026-11-01", ["2026-11-01T07:30:00Z"]),
    (
        NY,
        "30 1 * * *",
        "skip",
        "both",
        "2027-11-07",
        ["2027-11-07T05:30:00Z", "2027-11-07T06:30:00Z"],
    ),
    (NY, "30 2 * * *", "shift", "first", "2026-03-09", ["2026-03-09T06:30:00Z"]),
    (NY, "30 2 * * *", "skip", "first", "2026-03-07", ["2026-03-07T07:30:00Z"]),
    # Berlin: the gap is 02:00-03:00 (at 01:00 UTC), the fold 02:00-03:00 again.
    (BERLIN, "30 2 * * *", "shift", "first", "2026-03-29", ["2026-03-29T01:00:00Z"]),
    (BERLIN, "30 2 * * *", "skip", "first", "2026-03-29", []),
    (BERLIN, "30 2 * * *", "shift", "first", "2026-10-25", ["2026-10-25T00:30:00Z"]),
    (
        BERLIN,
        "30 2 * * *",
        "shift",
        "both",
        "2026-10-25",
        ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"],
    ),
    (BERLIN, "30 2 * * *", "shift", "first", "2027-03-28", ["2027-03-28T01:00:00Z"]),
    (
        BERLIN,
        "30 2 * * *",
        "skip",
        "both",
        "2027-10-31",
        ["2027-10-31T00:30:00Z", "2027-10-31T01:30:00Z"],
    ),
    # Dublin (negative DST in tzdata: IST is standard, GMT the "saving"): gap and fold
    # are 01:00-02:00 local; 02:30 exists once on both days.
    (DUBLIN, "30 1 * * *", "shift", "first", "2026-03-29", ["2026-03-29T01:00:00Z"]),
    (DUBLIN, "30 1 * * *", "skip", "first", "2026-03-29", []),
    (DUBLIN, "30 2 * * *", "skip", "first", "2026-03-29", ["2026-03-29T01:30:00Z"]),
    (DUBLIN, "30 1 * * *", "shift", "first", "2026-10-25", ["2026-10-25T00:30:00Z"]),
    (
        DUBLIN,
        "30 1 * * *",
        "shift",
        "both",
        "2026-10-25",
        ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"],
    ),
    (DUBLIN, "30 2 * * *", "shift", "both", "2026-10-25", ["2026-10-25T02:30:00Z"]),
    (DUBLIN, "30 1 * * *", "shift", "first", "2027-03-28", ["2027-03-28T01:00:00Z"]),
    (
        DUBLIN,
        "30 1 * * *",
        "shift",
        "both",
        "2027-10-31",
        ["2027-10-31T00:30:00Z", "2027-10-31T01:30:00Z"],
    ),
    # Lord Howe: 30 minutes. April: 02:00 (+11) back to 01:30 (+10:30), 01:30-02:00 twice.
    (LORD_HOWE, "45 1 * * *", "shift", "first", "2026-04-05", ["2026-04-04T14:45:00Z"]),
    (
        LORD_HOWE,
        "45 1 * * *",
        "shift",
        "both",
        "2026-04-05",
        ["2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z"],
    ),
    (LORD_HOWE, "30 2 * * *", "shift", "both", "2026-04-05", ["2026-04-04T16:00:00Z"]),
    (
        LORD_HOWE,
        "45 1 * * *",
        "skip",
        "both",
        "2027-04-04",
        ["2027-04-03T14:45:00Z", "2027-04-03T15:15:00Z"],
    ),
    # October: 02:00 (+10:30) forward to 02:30 (+11), 02:00-02:30 does not exist.
    (LORD_HOWE, "15 2 * * *", "shift", "first", "2026-10-04", ["2026-10-03T15:30:00Z"]),
    (LORD_HOWE, "15 2 * * *", "skip", "first", "2026-10-04", []),
    (LORD_HOWE, "30 2 * * *", "skip", "first", "2026-10-04", ["2026-10-03T15:30:00Z"]),
    (LORD_HOWE, "15 2 * * *", "shift", "first", "2027-10-03", ["2027-10-02T15:30:00Z"]),
    # Shanghai: +08:00 all year, every policy the same.
    (SHANGHAI, "30 2 * * *", "skip", "both", "2026-03-08", ["2026-03-07T18:30:00Z"]),
    (SHANGHAI, "30 2 * * *", "shift", "first", "2027-10-31", ["2027-10-30T18:30:00Z"]),
    # A 6-field expression (leading seconds, as QingLong writes them) at a fixed hour: the
    # three wall times in the gap shift to one instant; in the fold, both give six.
    (NY, "*/20 30 2 * * *", "shift", "first", "2026-03-08", ["2026-03-08T07:00:00Z"]),
    (NY, "*/20 30 2 * * *", "skip", "first", "2026-03-08", []),
    (
        BERLIN,
        "*/20 30 2 * * *",
        "shift",
        "both",
        "2026-10-25",
        [
            "2026-10-25T00:30:00Z",
            "2026-10-25T00:30:20Z",
            "2026-10-25T00:30:40Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T01:30:20Z",
            "2026-10-25T01:30:40Z",
        ],
    ),
    # Beirut: spring forward at 00:00 (00:00-01:00 missing), fall back at 24:00 to 23:00.
    (BEIRUT, "@daily", "shift", "first", "2026-03-29", ["2026-03-28T22:00:00Z"]),
    (BEIRUT, "@daily", "skip", "first", "2026-03-29", []),
    (BEIRUT, "30 23 * * *", "shift", "first", "2026-10-24", ["2026-10-24T20:30:00Z"]),
    (
        BEIRUT,
        "30 23 * * *",
        "shift",
        "both",
        "2026-10-24",
        ["2026-10-24T20:30:00Z", "2026-10-24T21:30:00Z"],
    ),
    # @daily is 0 0 * * *: midnight exists on these days, once.
    (NY, "@daily", "shift", "both", "2026-03-08", ["2026-03-08T05:00:00Z"]),
    (NY, "@daily", "shift", "both", "2026-11-01", ["2026-11-01T04:00:00Z"]),
    (LORD_HOWE, "@daily", "shift", "both", "2026-04-05", ["2026-04-04T13:00:00Z"]),
    (SHANGHAI, "@daily", "skip", "first", "2026-03-08", ["2026-03-07T16:00:00Z"]),
]


@pytest.mark.parametrize(("zone", "expr", "gap", "fold", "day", "expected"), FIXED)
def test_a_fixed_local_time_fires_as_the_gap_and_fold_policies_say(
    zone: str, expr: str, gap: str, fold: str, day: str, expected: list[str]
) -> None:
    assert fires_on(zone, (expr,), day, gap, fold) == expected


# Hour * or a step follows absolute time: a wall time in the gap never happens, one in the
# fold happens twice, whatever the policies say.
COUNTS = [
    (NY, "2026-03-08", 23, 46),
    (NY, "2026-11-01", 25, 50),
    (NY, "2027-03-14", 23, 46),
    (NY, "2027-11-07", 25, 50),
    (BERLIN, "2026-03-29", 23, 46),
    (BERLIN, "2026-10-25", 25, 50),
    (BERLIN, "2027-03-28", 23, 46),
    (BERLIN, "2027-10-31", 25, 50),
    (DUBLIN, "2026-03-29", 23, 46),
    (DUBLIN, "2026-10-25", 25, 50),
    (DUBLIN, "2027-03-28", 23, 46),
    (DUBLIN, "2027-10-31", 25, 50),
    # 02:00 is in the October gap; in April only the half hour 01:30 repeats.
    (LORD_HOWE, "2026-04-05", 24, 49),
    (LORD_HOWE, "2026-10-04", 23, 47),
    (LORD_HOWE, "2027-04-04", 24, 49),
    (LORD_HOWE, "2027-10-03", 23, 47),
    (SHANGHAI, "2026-03-08", 24, 48),
    (SHANGHAI, "2026-11-01", 24, 48),
    (NY, "2026-06-01", 24, 48),
    (BEIRUT, "2026-03-29", 23, 46),
    (BEIRUT, "2026-10-24", 25, 50),
]


@pytest.mark.parametrize(("zone", "day", "hourly", "half_hourly"), COUNTS)
@pytest.mark.parametrize(("gap", "fold"), [("shift", "first"), ("skip", "both")])
def test_an_hour_star_expression_follows_absolute_time_on_transition_days(
    zone: str, day: str, hourly: int, half_hourly: int, gap: str, fold: str
) -> None:
    assert len(fires_on(zone, ("0 * * * *",), day, gap, fold)) == hourly
    assert len(fires_on(zone, ("@hourly",), day, gap, fold)) == hourly
    assert len(fires_on(zone, ("*/30 * * * *",), day, gap, fold)) == half_hourly
    # A 6-field hour-star expression (second 15 of each hour) counts the same way.
    assert len(fires_on(zone, ("15 0 * * * *",), day, gap, fold)) == hourly


def test_a_new_york_hourly_spring_day_jumps_from_one_to_three() -> None:
    local = [local_iso(NY, ms(t)) for t in fires_on(NY, ("0 * * * *",), "2026-03-08")[:3]]
    assert local == [
        "2026-03-08T00:00:00-05:00",
        "2026-03-08T01:00:00-05:00",
        "2026-03-08T03:00:00-04:00",
    ]


def _per_local_day(zone: str, expr: str, gap: str, fold: str) -> Counter[dt.date]:
    spec = SlotSpec(cron=(expr,), every_seconds=None, timezone=zone, dst_gap=gap, dst_fold=fold)
    tz = ZoneInfo(zone)
    slots = slots_after(spec, ms("2025-12-31T00:00:00Z"), 2000)
    days = Counter(dt.datetime.fromtimestamp(s / 1000, tz).date() for s in slots)
    return Counter({d: n for d, n in days.items() if d.year in (2026, 2027)})


@pytest.mark.parametrize("zone", ZONES)
def test_a_fixed_time_fires_exactly_once_every_local_day_of_2026_and_2027(zone: str) -> None:
    days = _per_local_day(zone, "30 2 * * *", "shift", "first")
    assert len(days) == 730
    assert set(days.values()) == {1}


@pytest.mark.parametrize(
    ("zone", "missing", "doubled"),
    [
        (NY, {"2026-03-08", "2027-03-14"}, set()),
        (BERLIN, {"2026-03-29", "2027-03-28"}, {"2026-10-25", "2027-10-31"}),
        (DUBLIN, set(), set()),
        (LORD_HOWE, set(), set()),
        (SHANGHAI, set(), set()),
    ],
)
def test_skip_and_both_change_only_the_days_where_the_time_is_missing_or_repeated(
    zone: str, missing: set[str], doubled: set[str]
) -> None:
    days = _per_local_day(zone, "30 2 * * *", "skip", "both")
    all_days = {dt.date(2026, 1, 1) + dt.timedelta(days=i) for i in range(730)}
    assert {d.isoformat() for d in all_days - set(days)} == missing
    assert {d.isoformat() for d, n in days.items() if n == 2} == doubled
    assert set(days.values()) <= {1, 2}
