"""Slot instants of a schedule: cron union or interval, time zone and DST policies, catch-up.

docs/schedules-time.md explains each rule with an example. ``cronsim`` parses each expression
and decides which local days match (Vixie cron's day-of-month OR day-of-week, ``L``, ``#``);
this module turns a day's matching wall-clock times into instants with ``zoneinfo``, because
no cron library offers the gap (shift/skip) and fold (first/both) choices. A day whose UTC
offset does not change maps every wall time by one offset, so a day's slots are a cached
sorted tuple of times of day plus the day's UTC midnight: counting slots over years is one
bisection per day, never one step per slot (docs/schedules-time.md §4).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import importlib.resources
import itertools
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from app.domain.errors import InvalidSchedule, InvalidTimezone

MAX_EXPRESSIONS = 8
MAX_EXPRESSION_CHARS = 200
# At most this many missed slots fire under catchup "all"; the rest are recorded missed.
MAX_CATCHUP_FIRES = 100
# An expression that matches no day (``0 0 * * 1L`` of a 31st...) stops the search here,
# as cronsim itself gives up after 50 years.
_SEARCH_YEARS = 50
_DAY_S = 86_400
# Instants are reasoned about between these (years 1900 and 9000): dates beyond them overflow
# datetime, and no schedule needs them.
_MIN_MS = -2_208_988_800_000
_MAX_MS = 221_845_392_000_000
_EPOCH = dt.date(1970, 1, 1)
_ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    # Vixie cron's other names for the same slots.
    "@annually": "0 0 1 1 *",
    "@midnight": "0 0 * * *",
}
# Those are stored under the older name: a build before them (a rollback target) reads it.
_STORED_AS = {"@annually": "@yearly", "@midnight": "@daily"}


def stored_cron(exprs: tuple[str, ...]) -> tuple[str, ...]:
    """``exprs`` as stored: an alias only newer builds know becomes its older synonym."""
    return tuple(_STORED_AS.get(e.strip().lower(), e) for e in exprs)
GAP_POLICIES = ("shift", "skip")
FOLD_POLICIES = ("first", "both")
CATCHUP_POLICIES = ("latest", "all", "none")


@dataclass(frozen=True)
class SlotSpec:
    """What decides a schedule's slots (docs/schedules-time.md)."""

    cron: tuple[str, ...] | None
    every_seconds: int | None
    timezone: str = "UTC"
    dst_gap: str = "shift"
    dst_fold: str = "first"
    start_at_ms: int | None = None
    end_at_ms: int | None = None


@dataclass(frozen=True)
class CatchupPlan:
    """What to do with the slots due in (cursor, now]: fire some, record the rest missed."""

    fire: tuple[int, ...]
    missed_count: int
    missed_first_ms: int | None
    missed_last_ms: int | None
    cursor_ms: int


# eq=False: hashed by identity, so the per-day cache never hashes 86,400 times of day.
@dataclass(frozen=True, eq=False)
class _Expr:
    sim: CronSim
    months: frozenset[int]
    # Hour ``*`` or a step: the expression follows absolute time (docs/schedules-time.md §3).
    absolute: bool
    # Matching times of day in milliseconds after midnight, ascending; an array, not a
    # tuple: a 6-field every-second expression holds 86,400 of them.
    ms_of_day: array[int]


@dataclass(frozen=True, eq=False)
class _Cron:
    zone: ZoneInfo
    exprs: tuple[_Expr, ...]
    gap: str
    fold: str
    # The merged times of day of each set of expressions matching one day.
    unions: dict[tuple[_Expr, ...], array[int]] = field(default_factory=dict)


_NOT_IANA = "timezone must be an IANA name such as Asia/Shanghai"


def zone(name: str) -> ZoneInfo:
    """The zone ``name``, or InvalidTimezone. The detail never repeats the name: it is the
    client's input (docs/api.md §2)."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidTimezone(_NOT_IANA)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidTimezone(f"unknown time zone: {_NOT_IANA}") from None


@functools.cache
def _iana_names() -> frozenset[str]:
    """The zone names of the IANA database as the ``tzdata`` package lists them (a
    dependency, so the same on every host), less ``Factory``, which is no place's time."""
    listed = importlib.resources.files("tzdata").joinpath("zones").read_text("utf-8")
    return frozenset(listed.split()) - {"Factory"}


def _require_iana(name: str) -> None:
    """A new schedule's zone must be an IANA name. A file the host's zoneinfo directory
    happens to hold (``localtime``, ``posixrules``, ``posix/…``, ``right/…``) would make
    its slots depend on each host's own configuration."""
    zone(name)
    if name not in _iana_names():
        raise InvalidTimezone(f"not an IANA zone: {_NOT_IANA}")


# What each field may hold, for an error naming it (cronsim's own field names).
_FIELD_RANGES = {
    "second": "0-59",
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31 or L",
    "month": "1-12 or jan-dec",
    "day-of-week": "0-7 or sun-sat, 0 and 7 both Sunday",
}
# Each field's values (the day of week's 7 is 0 again). A step wider than what it steps over
# matches only the start (``*/1000`` of the minutes fires once an hour, ``*/31`` of the days
# of month on the 1st only, ``1-5/7`` of the days of week on Mondays only): never what was
# meant.
_FIELD_VALUES = {
    "second": (0, 59), "minute": (0, 59), "hour": (0, 23), "day-of-month": (1, 31),
    "month": (1, 12), "day-of-week": (0, 6),
}  # fmt: skip


def _step_refusal(fields: list[str]) -> str | None:
    """What is wrong with the first step (``*/n``, ``a-b/n``, ``a/n``) of 0 or wider than the
    values it steps over; None when every step fits. ``fields`` are 5, or 6 with seconds first.
    """
    for name, text in zip(list(_FIELD_VALUES)[-len(fields) :], fields, strict=True):
        low, high = _FIELD_VALUES[name]
        for term in text.split(","):
            base, slash, step = term.partition("/")
            if not (slash and step.isascii() and step.isdigit()):
                continue  # no step, or one cronsim refuses as it is
            first, dash, last = base.partition("-")
            over = ""
            width = high - low  # ``*``, or names (MON-FRI): the field's own width bounds it
            numbers = [first, last] if dash else [first]
            if all(one.isascii() and one.isdigit() for one in numbers):
                width = (int(last) if dash else high) - int(first)
                over = f" over {base}"
            if 1 <= int(step) <= max(width, 1):
                continue
            article = "an" if name == "hour" else "a"
            bound = f"1 to {width}" if width >= 1 else "1"
            return (
                f"{article} {name} step{over} must be {bound} (a larger one would match only "
                "the first value it steps over)"
            )
    return None


def _never_that_day(fields: list[str]) -> bool:
    """cronsim refuses a day-of-month no month of the expression has (``31 2``) as a bad
    day-of-month: true when the same expression in every month is accepted."""
    every_month = [*fields]
    every_month[-2] = "*"
    try:
        CronSim(" ".join(every_month), dt.datetime(2000, 1, 1))
    except CronSimError:
        return False
    return True


def _parse(index: int, text: str) -> _Expr:
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_EXPRESSION_CHARS:
        raise InvalidSchedule(f"cron[{index}]: an expression of 5 or 6 fields is required")
    expr = _ALIASES.get(text.strip().lower(), text)
    if expr.strip().lower() == "@reboot":
        raise InvalidSchedule(
            f"cron[{index}]: @reboot has no time to fire at; a schedule fires at times "
            "(run the task from what starts the service instead)"
        )
    if expr.lstrip().startswith("@"):
        raise InvalidSchedule(
            f"cron[{index}]: unknown alias; use one of {', '.join(sorted(_ALIASES))}"
        )
    fields = expr.split()
    if fields and fields[0].upper().startswith(("CRON_TZ=", "TZ=")):
        # A crontab line's zone setting, pasted with it: as 6 fields it read "Bad second".
        raise InvalidSchedule(
            f"cron[{index}]: a crontab's CRON_TZ= or TZ= setting is not part of an "
            "expression: give the zone as the schedule's timezone (the CLI's --timezone) "
            "and the fields alone"
        )
    if len(fields) not in (5, 6):
        raise InvalidSchedule(
            f"cron[{index}]: 5 fields, or 6 with a leading seconds field, are required"
        )
    try:
        sim = CronSim(expr, dt.datetime(2000, 1, 1))
    except CronSimError as exc:
        if (step := _step_refusal(fields)) is not None:
            raise InvalidSchedule(f"cron[{index}]: {step}") from None  # cronsim: "Bad minute"
        # cronsim says "Bad minute"; say what a minute may be, so the fix is in the answer.
        said = str(exc)
        allowed = _FIELD_RANGES.get(said.removeprefix("Bad ").strip())
        if said == "Bad day-of-month" and _never_that_day(fields):
            said += (
                ": none of its months has that day (like 30 February or 31 April), "
                "so it would never fire"
            )
        elif allowed:
            said += f" (its values: {allowed}; a list a,b, a range a-b or a step */n)"
        raise InvalidSchedule(f"cron[{index}]: {said}") from None
    hour = fields[-4]
    # Nested over sorted fields, the product is already ascending.
    minutes, seconds = sorted(sim.minutes), sorted(sim.seconds)
    ms_of_day = array(
        "q",
        [
            (h * 3600 + m * 60 + s) * 1000
            for h in sorted(sim.hours)
            for m in minutes
            for s in seconds
        ],
    )
    return _Expr(
        sim=sim,
        months=frozenset(sim.months),
        absolute=hour.startswith("*") or "/" in hour,
        ms_of_day=ms_of_day,
    )


def validate(spec: SlotSpec) -> None:
    """Raise InvalidSchedule or InvalidTimezone unless ``spec`` describes a new schedule.

    Stricter than computing a stored schedule's slots (``_compile``): a zone that is no IANA
    name and a step past its field's range are refused here, while one stored before those
    checks keeps its slots.
    """
    _require_iana(spec.timezone)
    _compile(spec)
    for index, expr in enumerate(spec.cron or ()):
        # Each one parsed above: 5 or 6 fields, or an alias (no step).
        if (step := _step_refusal(expr.split())) is not None:
            raise InvalidSchedule(f"cron[{index}]: {step}")


def _compile(spec: SlotSpec) -> _Cron | int:
    if (spec.cron is None) == (spec.every_seconds is None):
        raise InvalidSchedule("exactly one of cron and every_seconds is required")
    tz = zone(spec.timezone)
    if spec.dst_gap not in GAP_POLICIES:
        raise InvalidSchedule("dst_gap must be shift or skip")
    if spec.dst_fold not in FOLD_POLICIES:
        raise InvalidSchedule("dst_fold must be first or both")
    for name, bound in (("start_at_ms", spec.start_at_ms), ("end_at_ms", spec.end_at_ms)):
        if bound is not None and (
            not isinstance(bound, int) or isinstance(bound, bool) or not 0 <= bound <= _MAX_MS
        ):
            raise InvalidSchedule(f"{name} must be an instant in ms between 1970 and 9000")
    if (
        spec.start_at_ms is not None
        and spec.end_at_ms is not None
        and spec.end_at_ms < spec.start_at_ms
    ):
        raise InvalidSchedule("end_at_ms is before start_at_ms")
    if spec.every_seconds is not None:
        every = spec.every_seconds
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise InvalidSchedule("every_seconds must be an integer >= 1")
        return every
    cron = spec.cron
    if isinstance(cron, str) or not isinstance(cron, tuple | list):
        raise InvalidSchedule("cron must be a list of 1 to 8 expressions")
    if not 1 <= len(cron) <= MAX_EXPRESSIONS:
        raise InvalidSchedule(f"cron must hold 1 to {MAX_EXPRESSIONS} expressions")
    return _compiled_cron(tuple(cron), tz, spec.dst_gap, spec.dst_fold)


@functools.lru_cache(maxsize=128)
def _compiled_cron(cron: tuple[str, ...], tz: ZoneInfo, gap: str, fold: str) -> _Cron:
    return _Cron(tz, tuple(_parse(i, e) for i, e in enumerate(cron)), gap, fold)


# -- one local day ----------------------------------------------------------------------------


def _offset(tz: ZoneInfo, u: int) -> int:
    off = dt.datetime.fromtimestamp(u, tz).utcoffset()
    assert off is not None
    return int(off.total_seconds())


def _union(c: _Cron, exprs: tuple[_Expr, ...]) -> array[int]:
    """Times of day of the union, in milliseconds after local midnight, ascending."""
    if len(exprs) == 1:
        return exprs[0].ms_of_day
    found = c.unions.get(exprs)
    if found is None:
        merged: set[int] = set()
        for e in exprs:
            merged.update(e.ms_of_day)
        found = c.unions[exprs] = array("q", sorted(merged))
    return found


def _segments(tz: ZoneInfo, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(start, end, offset) runs of one UTC offset covering [lo, hi), in seconds."""
    out: list[tuple[int, int, int]] = []
    start, off = lo, _offset(tz, lo)
    step = 1800
    u = lo
    while u < hi:
        nxt = min(u + step, hi)
        off_n = _offset(tz, nxt)
        if off_n != off:
            a, b = u, nxt  # the offset changes in (a, b]
            while b - a > 1:
                mid = (a + b) // 2
                if _offset(tz, mid) == off:
                    a = mid
                else:
                    b = mid
            out.append((start, b, off))
            start, off = b, off_n
        u = nxt
    out.append((start, hi, off))
    return out


_ONE_DAY = dt.timedelta(days=1)


def _midnight(tz: ZoneInfo, day: dt.date, fold: int) -> int:
    return int(dt.datetime(day.year, day.month, day.day, fold=fold, tzinfo=tz).timestamp())


@functools.lru_cache(maxsize=1024)
def _day(c: _Cron, ordinal: int) -> tuple[int, Sequence[int]]:
    """The slots of local day ``ordinal`` as (base_ms, sorted offsets): base + offset each."""
    day = dt.date.fromordinal(ordinal)
    matching = tuple(e for e in c.exprs if day.month in e.months and e.sim.match_day(day))
    if not matching:
        return 0, ()
    wall = (ordinal - _EPOCH.toordinal()) * _DAY_S
    u0 = _midnight(c.zone, day, 0)
    # Both midnights exist once and are a whole day apart: then no transition lies between
    # (a fold reaching past midnight makes the next midnight happen twice).
    if (
        u0 == _midnight(c.zone, day, 1)
        and u0 + _offset(c.zone, u0) == wall
        and _midnight(c.zone, day + _ONE_DAY, 0) == u0 + _DAY_S
        and _midnight(c.zone, day + _ONE_DAY, 1) == u0 + _DAY_S
    ):
        # One offset all day (the common case): every wall time is one instant.
        return u0 * 1000, _union(c, matching)
    return 0, _transition_day(c, matching, wall)


def _transition_day(c: _Cron, matching: tuple[_Expr, ...], wall: int) -> array[int]:
    """Instants (ms) of a day whose offset changes: the gap and fold policies apply here.

    Each run of one offset maps a slice of the day's wall times by that offset (bisection,
    not a zone lookup per slot); walls no run covers are the gap, walls two runs cover the fold.
    """
    day_end = wall + _DAY_S
    segs = _segments(c.zone, wall - _DAY_S, day_end + _DAY_S)
    # Each part ascends: runs are in UTC order and a run's walls ascend.
    parts: list[list[int]] = []
    for absolute in (False, True):
        group = tuple(e for e in matching if e.absolute is absolute)
        if not group:
            continue
        times = _union(c, group)
        first_only = not absolute and c.fold == "first"
        covered: list[tuple[int, int]] = []
        covered_hi = wall
        instants: list[int] = []
        for s, e, off in segs:
            lo_w, hi_w = max(s + off, wall), min(e + off, day_end)
            if lo_w >= hi_w:
                continue
            covered.append((lo_w, hi_w))
            # Fold "first": walls an earlier run already showed do not fire again.
            start_w = max(lo_w, covered_hi) if first_only else lo_w
            i = bisect_left(times, (start_w - wall) * 1000)
            j = bisect_left(times, (hi_w - wall) * 1000)
            delta = (wall - off) * 1000
            instants.extend([t + delta for t in times[i:j]])
            covered_hi = max(covered_hi, hi_w)
        parts.append(instants)
        if absolute or c.gap == "skip":
            continue
        # Spring forward: a wall time in the gap fires at the first instant after the gap.
        covered.sort()
        cursor = wall
        shifted: list[int] = []
        for lo_w, hi_w in [*covered, (day_end, day_end)]:
            if lo_w > cursor:
                i = bisect_left(times, (cursor - wall) * 1000)
                if i < len(times) and times[i] < (lo_w - wall) * 1000:
                    shifted.append(min(s for (s, _e, off) in segs if s + off > cursor) * 1000)
            cursor = max(cursor, hi_w)
        parts.append(sorted(shifted))
    parts = [p for p in parts if p]
    if len(parts) == 1:
        return array("q", parts[0])
    return array("q", sorted(set(itertools.chain.from_iterable(parts))))


def _local_ordinal(tz: ZoneInfo, at_ms: int) -> int:
    return dt.datetime.fromtimestamp(at_ms // 1000, tz).date().toordinal()


# -- ranges: (a, b] in milliseconds ------------------------------------------------------------


def _forward(c: _Cron, a: int, b: int | None) -> Iterator[int]:
    """Slots in (a, b] ascending (b None: unbounded, up to the search horizon)."""
    ordinal = _local_ordinal(c.zone, a) - 1
    horizon = ordinal + _SEARCH_YEARS * 366
    stop = horizon if b is None else min(horizon, _local_ordinal(c.zone, b) + 1)
    last = a
    while ordinal <= stop:
        base, offs = _day(c, ordinal)
        for i in range(bisect_right(offs, last - base), len(offs)):
            v = base + offs[i]
            if b is not None and v > b:
                return
            last = v
            yield v
        ordinal += 1


def _backward(c: _Cron, a: int, b: int) -> Iterator[int]:
    """Slots in (a, b] descending."""
    ordinal = _local_ordinal(c.zone, b) + 1
    stop = _local_ordinal(c.zone, a) - 1
    last = b + 1
    while ordinal >= stop:
        base, offs = _day(c, ordinal)
        for i in range(bisect_right(offs, last - 1 - base) - 1, -1, -1):
            v = base + offs[i]
            if v <= a:
                return
            last = v
            yield v
        ordinal -= 1


def _count(c: _Cron, a: int, b: int) -> int:
    """How many slots lie in (a, b]: one bisection per local day."""
    ordinal = _local_ordinal(c.zone, a) - 1
    stop = _local_ordinal(c.zone, b) + 1
    n = 0
    last = a
    while ordinal <= stop:
        base, offs = _day(c, ordinal)
        lo = bisect_right(offs, last - base)
        hi = bisect_right(offs, b - base)
        if hi > lo:
            n += hi - lo
            last = base + offs[hi - 1]
        ordinal += 1
    return n


def _bounds(spec: SlotSpec, a: int, b: int | None) -> tuple[int, int]:
    a = max(a, _MIN_MS)
    b = _MAX_MS if b is None else min(b, _MAX_MS)
    if spec.start_at_ms is not None:
        a = max(a, spec.start_at_ms - 1)
    if spec.end_at_ms is not None:
        b = min(b, spec.end_at_ms)
    return a, b


def _take(it: Iterator[int], limit: int) -> list[int]:
    out: list[int] = []
    for v in it:
        if len(out) >= limit:
            break
        out.append(v)
    return out


def _after(kind: _Cron | int, a: int, b: int | None, limit: int) -> list[int]:
    if limit <= 0 or (b is not None and b <= a):
        return []
    if isinstance(kind, int):
        step = kind * 1000
        first = (a // step + 1) * step
        last = None if b is None else (b // step) * step
        n = limit if last is None else min(limit, (last - first) // step + 1)
        return [first + i * step for i in range(max(n, 0))]
    return _take(_forward(kind, a, b), limit)


def _before(kind: _Cron | int, a: int, b: int, limit: int) -> list[int]:
    """The newest ``limit`` slots in (a, b], descending."""
    if limit <= 0 or b <= a:
        return []
    if isinstance(kind, int):
        step = kind * 1000
        last = (b // step) * step
        first = (a // step + 1) * step
        n = min(limit, (last - first) // step + 1)
        return [last - i * step for i in range(max(n, 0))]
    return _take(_backward(kind, a, b), limit)


def _count_in(kind: _Cron | int, a: int, b: int) -> int:
    if b <= a:
        return 0
    if isinstance(kind, int):
        step = kind * 1000
        return b // step - a // step
    return _count(kind, a, b)


# -- the interface -----------------------------------------------------------------------------


def slots_after(spec: SlotSpec, after_ms: int, limit: int) -> list[int]:
    """Slot instants strictly after after_ms, ascending, at most limit, within start/end."""
    kind = _compile(spec)
    a, b = _bounds(spec, after_ms, None)
    return _after(kind, a, b, limit)


def last_slot(spec: SlotSpec, after_ms: int, until_ms: int) -> int | None:
    """The newest slot in (after_ms, until_ms], within start/end, or None when there is none."""
    kind = _compile(spec)
    a, b = _bounds(spec, after_ms, until_ms)
    found = _before(kind, a, b, 1)
    return found[0] if found else None


def next_slot(spec: SlotSpec, after_ms: int) -> int | None:
    """The first slot strictly after ``after_ms``, or None when there is none."""
    found = slots_after(spec, after_ms, 1)
    return found[0] if found else None


def local_iso(timezone: str, at_ms: int) -> str:
    """``at_ms`` as ISO 8601 local time in ``timezone`` with its UTC offset."""
    tz = zone(timezone)
    if not _MIN_MS <= at_ms <= _MAX_MS:
        raise InvalidSchedule("the instant is outside the years 1900 to 9000")
    moment = dt.datetime.fromtimestamp(at_ms // 1000, tz)
    if at_ms % 1000:
        moment = moment.replace(microsecond=(at_ms % 1000) * 1000)
        return moment.isoformat(timespec="milliseconds")
    return moment.isoformat(timespec="seconds")


def jitter_ms(schedule_id: str, slot_ms: int, jitter_seconds: int) -> int:
    """A delay in [0, jitter_seconds * 1000) fixed by the schedule and the slot."""
    if jitter_seconds < 0:
        raise InvalidSchedule("jitter_seconds must be >= 0")
    return _jitter(schedule_id, slot_ms, jitter_seconds * 1000)


# Two due instants are at least this far apart (or half the interval, if shorter).
JITTER_MARGIN_MS = 1000


def slot_jitter_ms(spec: SlotSpec, schedule_id: str, slot_ms: int, jitter_seconds: int) -> int:
    """The slot's jitter within its own interval: a delay in [0, min(jitter, gap - margin)),
    the gap the time to the next slot and the margin min(1 s, half the gap), fixed by the
    schedule and the slot. Each slot is then due at least the margin before the next one's
    instant, so slots fall due in their order, at least that far apart: a pass later than a
    slot's due instant by less than the margin meets no other slot due (a jitter as long as
    the interval let a pass take the slots still in their jitter for a backlog, recorded
    ``missed``). Where the jitter is shorter than that, it is ``jitter_ms`` exactly."""
    if jitter_seconds < 0:
        raise InvalidSchedule("jitter_seconds must be >= 0")
    span = jitter_seconds * 1000
    if span and (after := next_slot(spec, slot_ms)) is not None:
        gap = after - slot_ms
        span = min(span, gap - min(gap // 2, JITTER_MARGIN_MS))
    return _jitter(schedule_id, slot_ms, span)


def _jitter(schedule_id: str, slot_ms: int, span_ms: int) -> int:
    if span_ms <= 0:
        return 0
    digest = hashlib.blake2b(
        f"{schedule_id}\x00{slot_ms}".encode(), digest_size=8, person=b"ql-jitter"
    ).digest()
    return int.from_bytes(digest, "big") % span_ms


def plan_catchup(
    spec: SlotSpec, cursor_ms: int, now_ms: int, *, catchup: str, window_s: int
) -> CatchupPlan:
    """Due slots in (cursor_ms, now_ms]: "latest" | "all" (<=100 fired, rest missed) | "none";
    bounded time and memory even for 10**6 missed minutely slots."""
    if catchup not in CATCHUP_POLICIES:
        raise InvalidSchedule("catchup must be latest, all or none")
    if not isinstance(window_s, int) or window_s < 0:
        raise InvalidSchedule("catchup_window_seconds must be >= 0")
    kind = _compile(spec)
    if now_ms <= cursor_ms:
        # The clock went back (or nothing elapsed): the cursor never moves back.
        return CatchupPlan((), 0, None, None, cursor_ms)
    a, b = _bounds(spec, cursor_ms, now_ms)
    total = _count_in(kind, a, b)
    if total == 0:
        return CatchupPlan((), 0, None, None, now_ms)
    if catchup == "all":
        fire = _after(kind, a, b, MAX_CATCHUP_FIRES)
        missed = total - len(fire)
        if not missed:
            return CatchupPlan(tuple(fire), 0, None, None, now_ms)
        return CatchupPlan(
            tuple(fire),
            missed,
            _after(kind, fire[-1], b, 1)[0],
            _before(kind, a, b, 1)[0],
            now_ms,
        )
    newest = _before(kind, a, b, 2)
    if catchup == "latest" and newest[0] >= now_ms - window_s * 1000:
        if total == 1:
            return CatchupPlan((newest[0],), 0, None, None, now_ms)
        return CatchupPlan((newest[0],), total - 1, _after(kind, a, b, 1)[0], newest[1], now_ms)
    return CatchupPlan((), total, _after(kind, a, b, 1)[0], newest[0], now_ms)
