"""``python -m bench.schedule_slots``: the catch-up plan over 10**6 missed minutely slots.

Prints the time of ``plan_catchup`` (latest, all, none) for two years of a minutely cron
union in Europe/Berlin, beside the same-run baseline of stepping cronsim through 10**5 slots
(scaled to 10**6): what counting one slot at a time would cost (docs/schedules-time.md §4).
"""

from __future__ import annotations

import datetime as dt
import time
from zoneinfo import ZoneInfo

from cronsim import CronSim

from app.schedule import slots

MISSED = 10**6
STEPPED = 10**5


def _best_of(fn: object, repeats: int = 5) -> float:
    assert callable(fn)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    """Print each figure beside its baseline."""
    cursor = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
    now = cursor + MISSED * 60_000
    spec = slots.SlotSpec(
        cron=("* * * * *", "*/30 * * * *", "30 2 * * *"), every_seconds=None,
        timezone="Europe/Berlin",
    )  # fmt: skip
    for policy in ("latest", "all", "none"):
        slots._day.cache_clear()  # cold: every local day computed again
        plan = slots.plan_catchup(spec, cursor, now, catchup=policy, window_s=3600)
        seconds = _best_of(
            lambda p=policy: (
                slots._day.cache_clear(),
                slots.plan_catchup(spec, cursor, now, catchup=p, window_s=3600),
            )
        )
        print(
            f"plan_catchup {policy:6} {MISSED:,} minutely slots (cold): {seconds * 1000:8.1f} ms"
            f"  fired {len(plan.fire)}, missed {plan.missed_count:,}"
        )
    start = dt.datetime(2026, 1, 1, tzinfo=ZoneInfo("Europe/Berlin"))

    def step() -> None:
        it = CronSim("* * * * *", start)
        for _ in range(STEPPED):
            next(it)

    stepped = _best_of(step, repeats=1)
    print(
        f"baseline: cronsim stepped {STEPPED:,} slots: {stepped * 1000:8.1f} ms"
        f" (≈ {stepped * MISSED / STEPPED:.1f} s for {MISSED:,})"
    )


if __name__ == "__main__":
    main()
