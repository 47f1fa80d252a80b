"""PROVISIONAL slot arithmetic: ``every_seconds`` only, the interface h-slots implements.

Written by h-schedules so the storage, API and loop can be coded and tested against the
agreed interface; the lead replaces this file with h-slots' version at merge. Cron
expressions raise InvalidSchedule here.
"""

from __future__ import annotations

import datetime
import hashlib
import zoneinfo
from dataclasses import dataclass

from app.domain.errors import InvalidSchedule, InvalidTimezone

MAX_FIRED_ALL = 100


@dataclass(frozen=True)
class SlotSpec:
    """What decides a schedule's instants."""

    cron: tuple[str, ...] | None
    every_seconds: int | None
    timezone: str = "UTC"
    dst_gap: str = "shift"
    dst_fold: str = "first"
    start_at_ms: int | None = None
    end_at_ms: int | None = None


@dataclass(frozen=True)
class CatchupPlan:
    """Which due slots fire now, which are recorded missed, and the new cursor."""

    fire: tuple[int, ...]
    missed_count: int
    missed_first_ms: int | None
    missed_last_ms: int | None
    cursor_ms: int


def validate(spec: SlotSpec) -> None:
    """Raise InvalidSchedule / InvalidTimezone when the spec breaks a rule."""
    if (spec.cron is None) == (spec.every_seconds is None):
        raise InvalidSchedule("exactly one of cron and every_seconds is required")
    if spec.cron is not None:
        raise InvalidSchedule("cron: not available yet")
    if spec.every_seconds is not None and spec.every_seconds < 1:
        raise InvalidSchedule("every_seconds: must be >= 1")
    try:
        zoneinfo.ZoneInfo(spec.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidTimezone() from exc
    if spec.dst_gap not in ("shift", "skip") or spec.dst_fold not in ("first", "both"):
        raise InvalidSchedule("dst_gap/dst_fold: unknown policy")
    if (
        spec.start_at_ms is not None
        and spec.end_at_ms is not None
        and spec.end_at_ms < spec.start_at_ms
    ):
        raise InvalidSchedule("end_at_ms: before start_at_ms")


def _first_after(spec: SlotSpec, after_ms: int) -> int:
    step = (spec.every_seconds or 1) * 1000
    low = after_ms
    if spec.start_at_ms is not None and spec.start_at_ms - 1 > low:
        low = spec.start_at_ms - 1
    return (low // step + 1) * step


def slots_after(spec: SlotSpec, after_ms: int, limit: int) -> list[int]:
    """Slot instants strictly after after_ms, ascending, at most limit, within start/end."""
    step = (spec.every_seconds or 1) * 1000
    out: list[int] = []
    slot = _first_after(spec, after_ms)
    while len(out) < limit and (spec.end_at_ms is None or slot <= spec.end_at_ms):
        out.append(slot)
        slot += step
    return out


def next_slot(spec: SlotSpec, after_ms: int) -> int | None:
    """The first slot strictly after after_ms, or None when the schedule has ended."""
    found = slots_after(spec, after_ms, 1)
    return found[0] if found else None


def local_iso(timezone: str, at_ms: int) -> str:
    """``at_ms`` in ``timezone`` as ISO 8601 with its UTC offset."""
    zone = zoneinfo.ZoneInfo(timezone)
    moment = datetime.datetime.fromtimestamp(at_ms / 1000, tz=zone)
    return moment.isoformat(timespec="seconds")


def jitter_ms(schedule_id: str, slot_ms: int, jitter_seconds: int) -> int:
    """A deterministic delay in [0, jitter_seconds) derived from the schedule and slot."""
    if jitter_seconds <= 0:
        return 0
    digest = hashlib.sha256(f"{schedule_id}:{slot_ms}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (jitter_seconds * 1000)


def plan_catchup(
    spec: SlotSpec, cursor_ms: int, now_ms: int, *, catchup: str, window_s: int
) -> CatchupPlan:
    """Due slots in (cursor_ms, now_ms]: "latest" | "all" (<=100 fired) | "none"; O(1)."""
    if now_ms <= cursor_ms:
        return CatchupPlan((), 0, None, None, cursor_ms)
    step = (spec.every_seconds or 1) * 1000
    first = _first_after(spec, cursor_ms)
    last = now_ms // step * step
    if spec.end_at_ms is not None:
        last = min(last, spec.end_at_ms // step * step)
    if last < first:
        return CatchupPlan((), 0, None, None, now_ms)
    count = (last - first) // step + 1
    window_low = now_ms - window_s * 1000
    fire: tuple[int, ...]
    if catchup == "none":
        # The slot due right now is not a missed one: it fires on time.
        fire = (last,) if last == now_ms // step * step and count == 1 else ()
    elif catchup == "all":
        fire = tuple(first + i * step for i in range(min(count, MAX_FIRED_ALL)))
    else:
        fire = (last,) if last >= window_low else ()
    if catchup == "all":
        missed = count - len(fire)
        missed_first = first + len(fire) * step if missed else None
        missed_last = last if missed else None
    else:
        missed = count - len(fire)
        missed_first = first if missed else None
        missed_last = (last - step if fire else last) if missed else None
    return CatchupPlan(fire, missed, missed_first, missed_last, now_ms)
