"""Schedules: fire lateness of an every-second schedule, idle CPU with 10,000 schedules.

Fire lateness: a real api and worker (``bench/stack.py``) run an every-second schedule of
a ``/bin/true`` task for N slots; a slot's lateness is its run's ``created_at_ms`` minus the
slot's instant (the run exists once the fire transaction committed). Baseline, in the same
interval: a bare loop in a thread of the bench process that calls ``time.sleep`` until each
of the same whole seconds and records how late it woke (the operating system's own timer
lateness on this host at this moment).

Idle CPU: the CPU seconds (``utime + stime`` from ``/proc/<pid>/stat``, every process of
the service: the api, the worker, its zygote) over a fixed window, first with no schedule,
then on the same processes with 10,000 daily schedules none of which is due (9,999 rows
written by the bench in one transaction, as ``ScheduleRepository.put_schedule`` writes a new
schedule; the last through ``PUT``, which wakes the api's loop). Beside it, in process: one
pass of the loop's queries (``fire_due`` and ``earliest_due_ms``) over the 10,000, against
the same pass over an empty table.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

import httpx
from sqlalchemy import Engine, insert

from app.domain.canonical import canonical_json
from app.domain.ids import now_ms, uuid7
from app.domain.model import ScheduleDefinition
from app.schedule.slots import next_slot
from app.storage.engine import make_engine
from app.storage.schedules_repo import ScheduleRepository, spec_of
from app.storage.tables import schedules
from app.worker.identity import stat_fields
from bench.report import Figure, Report, median, percentile
from bench.stack import Stack, running_stack
from bench.trivial import define_task

TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_S = 3.0
PASSES = 200
WARM_UP = 20


def _sleep_loop(fires: int, out: list[float]) -> None:
    """Sleep until each of the next ``fires`` whole seconds; how late each wake was, ms."""
    for _ in range(fires):
        target = math.floor(time.time()) + 1.0
        time.sleep(max(0.0, target - time.time()))
        out.append((time.time() - target) * 1000)


def _runs(stack: Stack) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 200} | ({"cursor": cursor} if cursor else {})
        r = httpx.get(f"{stack.base_url}/api/v1/runs", params=params, headers=stack.auth)
        r.raise_for_status()
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return items


def run_fire_lateness(report: Report, *, pg: str | None, fires: int) -> None:
    """Add the fire lateness p50 and p99 over ``fires`` every-second slots for one database."""
    label = "postgresql" if pg else "sqlite"
    with running_stack(pg) as stack:
        define_task(stack)
        url = f"{stack.base_url}/api/v1/schedules/every-second"
        body = {"task": "true", "every_seconds": 1, "overlap": "allow", "max_concurrent": 10}
        baseline: list[float] = []
        sleeper = threading.Thread(target=_sleep_loop, args=(fires + 1, baseline), daemon=True)
        httpx.put(url, json=body, headers=stack.auth).raise_for_status()
        sleeper.start()
        sleeper.join()
        time.sleep(0.5)  # the last slot's run committed
        httpx.post(f"{url}/pause", headers=stack.auth).raise_for_status()
        runs = sorted(_runs(stack), key=lambda r: r["trigger"]["slot_ms"])[:fires]
    late = [float(r["created_at_ms"] - r["trigger"]["slot_ms"]) for r in runs]
    base = baseline[1:]  # the first wake comes from a sleep started mid-second
    extra = {"n": len(late), "baseline_n": len(base), "max_ms": max(late, default=math.nan),
             "baseline_max_ms": max(base, default=math.nan)}  # fmt: skip
    for q in (50, 99):
        report.add(Figure(
            f"{label} schedule fire lateness p{q}, {len(late)} fires", percentile(late, q), "ms",
            f"time.sleep loop lateness p{q}", percentile(base, q), False,
            target="< 1000 ms" if q == 99 else "", extra=extra,
        ))  # fmt: skip


def _service_pids() -> list[int]:
    """Every live descendant of this process: the stack's api, worker and the worker's zygote."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := stat_fields(int(name))) is not None:
            parents[int(name)] = int(fields[1])
    found, todo = [], [os.getpid()]
    while todo:
        parent = todo.pop()
        kids = [pid for pid, ppid in parents.items() if ppid == parent]
        found += kids
        todo += kids
    return sorted(found)


def _cpu_s(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        fields = stat_fields(pid)
        if fields is not None:
            out[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def _cpu_over(window_s: float) -> tuple[float, dict[str, float]]:
    """CPU seconds every process of the service spent over ``window_s``, and per pid."""
    pids = _service_pids()
    before = _cpu_s(pids)
    time.sleep(window_s)
    after = _cpu_s(pids)
    each = {str(pid): after[pid] - before[pid] for pid in before if pid in after}
    return sum(each.values()), each


def _pass_ms(repo: ScheduleRepository) -> float:
    """Median ms of one loop pass's queries: decide what is due, then the earliest due."""
    for _ in range(WARM_UP):  # statements compiled, pool connections open
        repo.fire_due()
        repo.earliest_due_ms()
    samples = []
    for _ in range(PASSES):
        t0 = time.perf_counter()
        repo.fire_due()
        repo.earliest_due_ms()
        samples.append((time.perf_counter() - t0) * 1000)
    return median(samples)


def _write_daily(engine: Engine, count: int, hour: int) -> None:
    """``count`` daily schedules in one transaction, as ``put_schedule`` writes a new one
    (one transaction each would take minutes on this host); 60 distinct minutes of ``hour``."""
    at = now_ms()
    rows = []
    for n in range(count):
        cron = (f"{n % 60} {hour} * * *",)
        definition = ScheduleDefinition(task="true", revision=None, cron=cron, every_seconds=None)
        rows.append({
            "id": uuid7(at), "name": f"daily-{n:05d}",
            "body": canonical_json(definition.body()).decode("utf-8"), "version": 1,
            "cursor_ms": at, "next_due_ms": next_slot(spec_of(definition), at), "paused": False,
            "created_at_ms": at, "updated_at_ms": at,
        })  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(schedules), rows)


def run_idle_cpu(report: Report, *, pg: str | None, count: int, window_s: float) -> None:
    """Add the idle CPU with ``count`` schedules against none, for one database."""
    label = "postgresql" if pg else "sqlite"
    with running_stack(pg) as stack:
        define_task(stack)
        time.sleep(SETTLE_S)  # start-up work (migrations, the first passes) is over
        idle_s, idle_each = _cpu_over(window_s)
        engine = make_engine(stack.url)
        try:
            repo = ScheduleRepository(engine)
            empty_ms = _pass_ms(repo)
            hour = (time.gmtime().tm_hour + 12) % 24  # daily, 12 h on: none due in the window
            t0 = time.perf_counter()
            _write_daily(engine, count - 1, hour)
            written_s = time.perf_counter() - t0
            body = {"task": "true", "cron": [f"0 {hour} * * *"]}
            put = httpx.put(f"{stack.base_url}/api/v1/schedules/daily-last", json=body,
                            headers=stack.auth)  # fmt: skip
            put.raise_for_status()  # the api's loop wakes and reads the earliest due slot
            time.sleep(1.0)
            busy_s, busy_each = _cpu_over(window_s)
            full_ms = _pass_ms(repo)
        finally:
            engine.dispose()
    # /proc counts CPU in clock ticks (10 ms at the usual 100 Hz): a window's figure moves by
    # a tick or two from nothing at all.
    extra = {"window_s": window_s, "tick_s": 1 / TICKS, "schedules": count,
             "written_s": round(written_s, 2),
             "per_pid_idle": idle_each, "per_pid_busy": busy_each}  # fmt: skip
    report.add(Figure(
        f"{label} idle service CPU over {window_s:g} s, {count:,} schedules", busy_s, "s",
        "same service, no schedule", idle_s, False, target="no measurable CPU", extra=extra,
    ))  # fmt: skip
    report.add(Figure(
        f"{label} loop pass (fire_due+earliest_due), {count:,} idle", full_ms, "ms",
        "same pass, no schedule", empty_ms, False, extra={"passes": PASSES},
    ))  # fmt: skip
