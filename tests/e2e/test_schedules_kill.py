"""SIGKILLed api workers and worker never fire a slot twice nor lose one (docs/schedules.md §2).

One every-second schedule runs for 96 slots on a real ``qinglong serve --workers 2`` (two
scheduling loops racing) while a uvicorn worker or the supervised worker is SIGKILLed, by
pid, every 6 s (16 kills), at varied offsets after a slot's instant (inside the fire
transaction, the dispatch, the launch). Every slot from the first to the last decided has
exactly one decision, every fired slot exactly one run, and every run ends with exactly one
terminal event once the service settles, through recovery where a kill interrupted it (the
runs and decisions are read over HTTP, the terminal events of all runs in one query).

SQLite and, when ``QL_TEST_POSTGRES_URL`` is set, PostgreSQL run side by side in the same
96 s (one service each): the test is mostly waiting for slots, so one item costs its
xdist worker 96 s for both engines instead of 192 s. It is marked ``slow`` and scheduled
first (tests/conftest.py), so it never makes the run's tail.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.tables import run_events
from tests.conftest import PG_ENV, private_pg_schema
from tests.e2e.conftest import Served, ServeFactory, proc_stat, wait_until
from tests.e2e.kit import TERMINAL, TERMINAL_EVENTS, put_task
from tests.e2e.test_supervisor import uvicorn_workers
from tests.kit import web
from tests.worker.kit import kill_exact

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# 96 slots, a kill every 6 s: 16 kills (12 of an api worker, 4 of the worker; the first
# version made 20 over 200 slots, every 10 s), in 104 s less of CI's time (docs/testing.md).
SLOTS = 96
KILL_EVERY_S = 6
# Three api-worker kills for one worker kill: the supervisor's restart delay doubles for a
# worker that lived under 60 s (0.5, 1, 2, 4, 8 s over these five, 24 s apart), uvicorn
# replaces its workers at once.
PATTERN = ("api", "worker", "api", "api")
# Milliseconds after a slot's instant: the loop wakes ~2 ms after it, commits the fire, kicks
# the drain, T1, the launch, T2, the job's receipt.
OFFSETS_MS = (3, 8, 15, 30, 60, 120, 250, 500)
SETTLE_S = 120.0
# The only endings a kill may leave (docs/crash-windows.md): a start the worker never
# journaled is requeued (that attempt failed EXECUTOR_UNAVAILABLE, the run goes on); a start
# journaled ``spawned`` without T2 is lost RECOVERY_START_INTERRUPTED (the worker now commits
# T2 with ``spawned``, so a kill no longer leaves one; still allowed, never required).
FINAL = {("succeeded", None), ("lost", "RECOVERY_START_INTERRUPTED")}
EARLIER = {("failed", "EXECUTOR_UNAVAILABLE")}


@dataclass
class Target:
    """One service under fire and what was done to it."""

    label: str
    served: Served
    kills: Counter[str] = field(default_factory=Counter)

    @property
    def url(self) -> str:
        return f"{self.served.base_url}/api/v1/schedules/every-second"


@pytest.fixture
def pg_url() -> Iterator[str | None]:
    """A fresh PostgreSQL schema when QL_TEST_POSTGRES_URL is set (it outlives the
    services: requested before ``serve_factory``), else None (SQLite only)."""
    if not os.environ.get(PG_ENV):
        yield None
        return
    with private_pg_schema("ql_sched_kill") as url:
        yield url


def _pages(served: Served, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": 200} | ({"cursor": cursor} if cursor else {})
        r = web.get(f"{served.base_url}{path}", params=params, headers=served.auth, timeout=10)
        assert r.status_code == 200, r.text
        body = r.json()
        items += body["items"]
        cursor = body["next_cursor"]
        if cursor is None:
            return items


def _start(serve_factory: ServeFactory, label: str, url: str | None) -> Target:
    served = serve_factory(database_url=url, workers=2)
    api = served.service_pids()["api"]
    wait_until("two uvicorn workers", lambda: len(uvicorn_workers(api)) == 2, 30)
    put_task(served, "tick", "true")
    return Target(label, served)


def _schedule(target: Target) -> None:
    body = {
        "task": "tick", "every_seconds": 1, "overlap": "allow", "max_concurrent": 100,
        "catchup": "all",
    }  # fmt: skip
    r = web.put(target.url, json=body, headers=target.served.auth, timeout=5)
    assert r.status_code == 201, r.text


def _kill(target: Target, kind: str, step: int) -> None:
    """SIGKILL one uvicorn worker (waiting up to 2 s for uvicorn to have one) or the worker,
    by pid and start time."""
    if kind == "api":
        deadline = time.monotonic() + 2.0
        while not (workers := _api_workers(target)) and time.monotonic() < deadline:
            time.sleep(0.05)  # uvicorn is still replacing the last one (a kill 6 s ago)
        if not workers:
            target.kills["api skipped"] += 1
            return
        kill_exact(*workers[step % len(workers)])
    else:
        pids = target.served.service_pids()
        stat = proc_stat(pids["worker"]) if "worker" in pids else None
        if stat is None:  # the supervisor has not restarted it yet
            target.kills["worker skipped"] += 1
            return
        kill_exact(pids["worker"], stat[3])
    target.kills[kind] += 1


def _api_workers(target: Target) -> list[tuple[int, int]]:
    pids = target.served.service_pids()
    return sorted(uvicorn_workers(pids["api"]).items()) if "api" in pids else []


def _covered(decisions: list[dict[str, Any]]) -> list[int]:
    """The slots the decisions cover (a collapsed ``missed`` covers its whole range)."""
    covered: list[int] = []
    for d in decisions:
        if d["decision"] == "missed":
            covered += range(d["slot_ms"], d["until_slot_ms"] + 1000, 1000)
        else:
            covered.append(d["slot_ms"])
    return sorted(covered)


def _pause(target: Target) -> None:
    def paused() -> bool:
        try:
            r = web.post(f"{target.url}/pause", headers=target.served.auth, timeout=5)
        except httpx.HTTPError:  # the answering uvicorn worker was just killed
            return False
        return r.status_code == 200

    wait_until(f"{target.label}: the pause to be answered", paused, 60)


def _decided(target: Target) -> Callable[[], bool]:
    def check() -> bool:
        try:
            decisions = _pages(target.served, "/api/v1/schedules/every-second/decisions")
        except httpx.HTTPError:  # a uvicorn worker killed a moment ago
            return False
        return len(_covered(decisions)) >= SLOTS

    return check


def _settled(target: Target) -> Callable[[], bool]:
    def check() -> bool:
        try:
            runs = _pages(target.served, "/api/v1/runs")
        except httpx.HTTPError:
            return False
        return all(r["status"] in TERMINAL for r in runs)

    return check


def _terminal_events(served: Served) -> dict[str, list[str]]:
    """Every run's terminal run events, in one query on the service's database (the same
    events ``GET /runs/{id}/events`` lists: 400 GETs cost over a minute on a loaded host)."""
    engine = make_engine(Settings.from_env(served.env).database_url)
    query = select(run_events.c.run_id, run_events.c.type)
    query = query.where(run_events.c.type.in_(sorted(TERMINAL_EVENTS))).order_by(run_events.c.seq)
    try:
        with engine.connect() as conn:
            rows = conn.execute(query).all()
    finally:
        engine.dispose()
    out: dict[str, list[str]] = {}
    for run_id, kind in rows:
        out.setdefault(run_id, []).append(kind)
    return out


def _check(target: Target) -> dict[str, object]:
    served = target.served
    decisions = _pages(served, "/api/v1/schedules/every-second/decisions")
    covered = _covered(decisions)
    assert covered == list(range(covered[0], covered[-1] + 1000, 1000)), "one decision per slot"
    assert len(covered) >= SLOTS

    runs = _pages(served, "/api/v1/runs")
    fired = {d["slot_ms"]: d["run"] for d in decisions if d["decision"] == "fired"}
    by_slot = {r["trigger"]["slot_ms"]: r["id"] for r in runs}
    assert len(by_slot) == len(runs) and by_slot == fired, "one run per fired slot"

    endings: Counter[tuple[str, str | None]] = Counter()
    earlier: Counter[tuple[str, str | None]] = Counter()
    ended = _terminal_events(served)
    for run in runs:
        latest = run["latest_attempt"]
        endings[(run["status"], latest["error_code"])] += 1
        assert ended.get(run["id"]) == [f"run.{run['status']}"], run
        if latest["number"] > 1:
            attempts = _pages(served, f"/api/v1/runs/{run['id']}/attempts")
            for a in attempts[:-1]:
                earlier[(a["status"], a["error_code"])] += 1
    assert set(endings) <= FINAL, endings
    assert set(earlier) <= EARLIER, earlier
    return {
        "slots": len(covered),
        "decisions": Counter(d["decision"] for d in decisions),
        "endings": endings,
        "requeued attempts": earlier,
        "kills": target.kills,
    }


def test_sigkilled_api_workers_and_worker_leave_one_decision_per_slot_and_one_ending_per_run(
    pg_url: str | None, serve_factory: ServeFactory
) -> None:
    marks = [time.monotonic()]
    targets = [_start(serve_factory, "sqlite", None)]
    if pg_url is not None:
        targets.append(_start(serve_factory, "postgresql", pg_url))
    for target in targets:
        _schedule(target)
    marks.append(time.monotonic())
    end = time.time() + SLOTS + 1
    step = 0
    while True:
        # The next kill: KILL_EVERY_S whole seconds on, a few ms after that slot's instant.
        at = int(time.time()) + KILL_EVERY_S + OFFSETS_MS[step % len(OFFSETS_MS)] / 1000
        if at > end:
            break
        time.sleep(max(0.0, at - time.time()))
        for target in targets:
            _kill(target, PATTERN[step % len(PATTERN)], step)
        step += 1
    marks.append(time.monotonic())
    for target in targets:
        wait_until(f"{target.label}: {SLOTS} slots decided", _decided(target), 60)
        _pause(target)
    for target in targets:
        wait_until(f"{target.label}: every scheduled run to end", _settled(target), SETTLE_S)
    marks.append(time.monotonic())
    summary: dict[str, object] = {target.label: _check(target) for target in targets}
    marks.append(time.monotonic())
    phases = ("start", "kills", "decided+paused+settled", "checks")
    spans = [round(b - a, 1) for a, b in itertools.pairwise(marks)]
    summary["seconds"] = dict(zip(phases, spans, strict=True))
    for target in targets:
        assert target.kills["api"] >= 10 and target.kills["worker"] >= 3, target.kills
    print(summary)  # shown with -s, or -rA
