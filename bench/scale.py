"""Scale: list-page and dispatch-candidate latency with 1k, 10k and 100k runs stored."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine, insert, text

from app.domain.ids import uuid7
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.run_reads import RunReader
from app.storage.tables import attempts, run_events, runs
from bench.report import Figure, Report, median

STATUSES = ["succeeded", "failed", "queued", "running"]


def _fill(engine: Engine, total: int, already: int) -> None:
    batch = 5000
    for start in range(already, total, batch):
        run_rows, attempt_rows, event_rows = [], [], []
        for i in range(start, min(total, start + batch)):
            rid = uuid7()
            status = STATUSES[i % 4]
            run_rows.append(
                {"id": rid, "task": f"task-{i % 20}", "revision": 1, "status": status,
                 "priority": i % 3, "version": 1, "latest_attempt": 1, "created_at_ms": 1_000 + i}
            )  # fmt: skip
            attempt_rows.append(
                {"id": uuid7(), "run_id": rid, "number": 1,
                 "status": "claimed" if status == "queued" else status,
                 "executor": "local_process", "created_at_ms": 1_000 + i, "callback_sequence": 0}
            )  # fmt: skip
            event_rows.append(
                {"run_id": rid, "seq": 1, "type": "run.queued", "at_ms": 1, "data": "{}"}
            )
        with engine.begin() as conn:
            conn.execute(insert(runs), run_rows)
            conn.execute(insert(attempts), attempt_rows)
            conn.execute(insert(run_events), event_rows)


def _time(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return median(samples)


def run_scale(report: Report, *, url: str | None, sizes: list[int], repeats: int) -> None:
    """Fill one database step by step and time the same queries at each size."""
    tmp = tempfile.TemporaryDirectory(prefix="ql-bench-scale-")
    try:
        engine = make_engine(url or f"sqlite:///{Path(tmp.name) / 'scale.db'}")
        label = "sqlite" if url is None else "postgresql"
        upgrade_to_head(engine)
        if url is not None:
            with engine.begin() as conn:
                for table in ("run_events", "attempts", "runs", "task_revisions"):
                    conn.execute(text(f"DELETE FROM {table}"))
        defs = DefinitionRepository(engine)
        for t in range(20):
            defs.put_revision(
                task=f"task-{t}", revision=1, executor="local_process", argv=["/bin/true"],
                cwd=None, recipe=None, timeout_seconds=None, priority=0,
            )  # fmt: skip
        reader = RunReader(engine)
        timings: dict[int, dict[str, float]] = {}
        filled = 0
        for size in sizes:
            _fill(engine, size, filled)
            filled = size
            # Fresh planner statistics, as autovacuum / a periodic ANALYZE keeps them in
            # production: without them PostgreSQL picks a join that reads every attempt.
            with engine.begin() as conn:
                conn.execute(text("ANALYZE"))
            first = reader.list_runs(task=None, status=None, limit=50, cursor=None)
            deep_cursor = first.next_cursor
            timings[size] = {
                "select 1": _time(lambda: _select_one(engine), repeats),
                "list page 1": _time(
                    lambda: reader.list_runs(task=None, status=None, limit=50, cursor=None), repeats
                ),
                "list page 2 (cursor)": _time(
                    lambda c=deep_cursor: reader.list_runs(
                        task=None, status=None, limit=50, cursor=c
                    ),
                    repeats,
                ),
                "list filtered task+status": _time(
                    lambda: reader.list_runs(task="task-3", status="failed", limit=50, cursor=None),
                    repeats,
                ),
                "dispatch candidates (16)": _time(
                    lambda: reader.dispatch_candidates(limit=16), repeats
                ),
            }
        smallest, largest = sizes[0], sizes[-1]
        for name in timings[smallest]:
            if name == "select 1":
                continue
            report.add(
                Figure(
                    name=f"{label} {name} @{largest // 1000}k",
                    value=timings[largest][name],
                    unit="ms",
                    baseline_name=f"same @{smallest // 1000}k",
                    baseline=timings[smallest][name],
                    higher_is_better=False,
                    target="ratio <= 1.5" if name.startswith("list") else "",
                    extra={f"{s}": timings[s][name] for s in sizes}
                    | {"select_1_ms": timings[largest]["select 1"]},
                )
            )
        engine.dispose()
    finally:
        tmp.cleanup()


def _select_one(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
