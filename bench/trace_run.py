"""Where one run's time goes, step by step, through a real ``qinglong`` api and worker.

``python -m bench.trace_run [--pg URL] [--runs N] [--gap S] [--env K=V ...]`` starts a stack
(``bench/stack.py``), posts N ``/bin/true`` runs one at a time (``--gap`` seconds apart, so
each meets an idle system), and prints, for every step the database records (the run's
events, its attempt's times, the POST as the client saw it), the p50 and max of its offset
in ms from the run's ``created_at_ms``. ``--env QL_CGROUP_ROOT=off`` passes a setting to the
stack's processes (a same-run baseline: run it twice). The first five runs warm up and are
not counted. Timestamps are the database's milliseconds, so steps under 1 ms apart tie.
Each step is printed beside two baselines measured in the same run: one small INSERT +
COMMIT on the same database, and a bare ``posix_spawn`` + ``waitpid`` of ``/bin/true``; the
same spawn is also timed after sleeping ``--gap`` each time, as each run here meets an idle
host (on a virtual machine the first work after idle can be several times slower).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from pathlib import Path

import httpx
from sqlalchemy import Connection, Engine, text

import bench.stack as stack_module
from app.storage.engine import make_engine
from app.storage.private_files import SERVICE_UMASK
from bench.stack import running_stack
from bench.trivial import bare_spawn_ms, commit_rate, define_task

WARM_UP = 5
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")


def trace(pg: str | None, runs: int, gap_s: float) -> tuple[dict[str, list[float]], float]:
    """Offsets (ms from created_at_ms) of each recorded step, per counted run, and the ms of
    one commit on the same database, measured after the runs."""
    offsets: dict[str, list[float]] = collections.defaultdict(list)
    with running_stack(pg) as stack:
        define_task(stack)
        engine = make_engine(stack.url)
        try:
            posted: list[tuple[str, float, float]] = []
            with httpx.Client(base_url=stack.base_url, headers=stack.auth) as client:
                for _ in range(runs + WARM_UP):
                    sent = time.time() * 1000
                    answer = client.post("/api/v1/runs", json={"task": "true"})
                    answer.raise_for_status()
                    posted.append((answer.json()["id"], sent, time.time() * 1000))
                    _wait_terminal(engine, posted[-1][0])
                    time.sleep(gap_s)
            with engine.connect() as conn:
                for run_id, sent, answered in posted[WARM_UP:]:
                    _collect(conn, run_id, sent, answered, offsets)
            commit_ms = 1000 / commit_rate(stack.url, 200)
        finally:
            engine.dispose()
    return offsets, commit_ms


def _wait_terminal(engine: Engine, run_id: str) -> None:
    query = text("SELECT status FROM runs WHERE id = :id")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(query, {"id": run_id}).scalar() in TERMINAL:
                return
        time.sleep(0.002)
    raise RuntimeError(f"run {run_id} did not end in 30 s")


def _collect(
    c: Connection, run_id: str, sent: float, answered: float, out: dict[str, list[float]]
) -> None:
    run = c.execute(
        text("SELECT created_at_ms, started_at_ms, finished_at_ms FROM runs WHERE id = :id"),
        {"id": run_id},
    ).one()
    base = run.created_at_ms
    out["POST sent (client clock)"].append(sent - base)
    out["POST answered (client clock)"].append(answered - base)
    out["run started_at (the job's start, as the shim saw it)"].append(run.started_at_ms - base)
    out["run finished_at"].append(run.finished_at_ms - base)
    events = c.execute(
        text("SELECT type, at_ms FROM run_events WHERE run_id = :id ORDER BY seq"), {"id": run_id}
    )
    for event in events:
        out[f"event {event.type}"].append(event.at_ms - base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pg", default=None, help="a PostgreSQL URL (default: SQLite)")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--gap", type=float, default=0.05)
    parser.add_argument("--env", action="append", default=[], metavar="K=V")
    args = parser.parse_args()
    os.umask(SERVICE_UMASK)
    extra = dict(kv.split("=", 1) for kv in args.env)
    if extra:
        base_env = stack_module.env_for

        def env_for(data: Path, url: str) -> dict[str, str]:
            return base_env(data, url) | extra

        stack_module.env_for = env_for
    offsets, commit_ms = trace(args.pg, args.runs, args.gap)
    spawn_ms = statistics.median(bare_spawn_ms(200))
    cold_ms = statistics.median(bare_spawn_ms(50, idle_s=args.gap))
    print(
        f"same-run baselines: one INSERT+COMMIT {commit_ms:.2f} ms, "
        f"posix_spawn+waitpid /bin/true {spawn_ms:.2f} ms "
        f"({cold_ms:.2f} ms each after {args.gap * 1000:g} ms asleep, as the runs here)"
    )
    for step, values in sorted(offsets.items(), key=lambda kv: statistics.median(kv[1])):
        p50 = statistics.median(values)
        print(
            f"{step:<56} p50 {p50:7.1f} ms   max {max(values):7.1f} ms"
            f"   = {p50 / commit_ms:6.1f} commits, {p50 / spawn_ms:6.1f} spawns"
        )


if __name__ == "__main__":
    main()
