"""Schedule slots against a brute-force oracle built on zoneinfo's fold alone.

docs/schedules-time.md §2, §3. The oracle walks every minute (absolute expressions) or every
local wall time with fold=0/1 (fixed-hour expressions), knowing nothing of how
app/schedule/slots.py maps a day; any difference on a transition day is a bug in one of them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from app.schedule.slots import SlotSpec, slots_after

DAYS = [
    ("America/New_York", "2026-03-08"), ("America/New_York", "2026-11-01"),
    ("Europe/Berlin", "2027-03-28"), ("Europe/Berlin", "2027-10-31"),
    ("Australia/Lord_Howe", "2026-04-05"), ("Australia/Lord_Howe", "2027-10-03"),
    ("Europe/Dublin", "2026-10-25"), ("Asia/Shanghai", "2026-03-08"),
    ("Asia/Beirut", "2026-03-29"), ("Asia/Beirut", "2026-10-24"),
]  # fmt: skip


def _window(day: str) -> tuple[int, int]:
    d = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
    return int(d.timestamp()) - 86_400, int(d.timestamp()) + 2 * 86_400


def _ours(spec: SlotSpec, lo: int, hi: int) -> list[int]:
    bounded = dataclasses.replace(spec, end_at_ms=hi * 1000 - 1)
    return [s // 1000 for s in slots_after(bounded, lo * 1000 - 1, 5000)]


@given(st.sampled_from(DAYS), st.sampled_from([1, 7, 15, 30]), st.integers(0, 59))
@settings(max_examples=40, deadline=None)
def test_an_hour_star_expression_fires_at_every_instant_whose_wall_clock_matches(
    place: tuple[str, str], step: int, offset: int
) -> None:
    zone, day = place
    tz = ZoneInfo(zone)
    minute = offset % step
    spec = SlotSpec(cron=(f"{minute}-59/{step} * * * *",), every_seconds=None, timezone=zone)
    lo, hi = _window(day)
    expected = [
        u
        for u in range(lo, hi, 60)
        if (m := dt.datetime.fromtimestamp(u, tz).minute) >= minute and (m - minute) % step == 0
    ]
    assert _ours(spec, lo, hi) == expected


@given(
    st.sampled_from(DAYS),
    st.sampled_from([0, 1, 2, 3, 23]),
    st.sampled_from([0, 15, 30, 45]),
    st.sampled_from(["shift", "skip"]),
    st.sampled_from(["first", "both"]),
)
@settings(max_examples=60, deadline=None)
def test_a_fixed_hour_expression_maps_each_wall_time_by_the_gap_and_fold_policies(
    place: tuple[str, str], hour: int, minute: int, gap: str, fold: str
) -> None:
    zone, day = place
    tz = ZoneInfo(zone)
    spec = SlotSpec(
        cron=(f"{minute} {hour} * * *",), every_seconds=None, timezone=zone,
        dst_gap=gap, dst_fold=fold,
    )  # fmt: skip
    lo, hi = _window(day)
    expected: set[int] = set()
    first = dt.date.fromisoformat(day) - dt.timedelta(days=2)
    for i in range(5):
        d = first + dt.timedelta(days=i)
        naive = dt.datetime(d.year, d.month, d.day, hour, minute)
        u0 = int(naive.replace(tzinfo=tz, fold=0).timestamp())
        u1 = int(naive.replace(tzinfo=tz, fold=1).timestamp())
        if dt.datetime.fromtimestamp(u0, tz).replace(tzinfo=None) != naive:
            if gap == "shift":  # the first minute whose wall time is past the missing one
                u = min(u0, u1) - (min(u0, u1) % 60)
                while dt.datetime.fromtimestamp(u, tz).replace(tzinfo=None) <= naive:
                    u += 60
                expected.add(u)
        elif u0 != u1 and fold == "both":
            expected.update((u0, u1))
        else:
            expected.add(min(u0, u1))
    assert _ours(spec, lo, hi) == sorted(u for u in expected if lo <= u < hi)
