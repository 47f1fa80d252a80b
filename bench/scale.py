"""Scale: list-page and dispatch-candidate latency with 1k, 10k and 100k runs stored."""

from __future__ import annotations

import time
from collections.abc import Callable

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


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def _prepare(url: str, size: int) -> Engine:
    """A migrated database holding ``size`` runs (20 tasks), with fresh planner statistics."""
    engine = make_engine(url)
    upgrade_to_head(engine)
    defs = DefinitionRepository(engine)
    for t in range(20):
        defs.put_revision(
            task=f"task-{t}", revision=1, executor="local_process", argv=["/bin/true"],
            cwd=None, recipe=None, timeout_seconds=None, priority=0,
        )  # fmt: skip
    _fill(engine, size, 0)
    # Fresh planner statistics, as autovacuum / a periodic ANALYZE keeps them in production:
    # without them PostgreSQL picks a join that reads every attempt.
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))
    return engine


def _queries(engine: Engine) -> dict[str, Callable[[], object]]:
    reader = RunReader(engine)
    deep_cursor = reader.list_runs(task=None, status=None, limit=50, cursor=None).next_cursor
    return {
        "select 1": lambda: _select_one(engine),
        "list page 1": lambda: reader.list_runs(task=None, status=None, limit=50, cursor=None),
        "list page 2 (cursor)": lambda: reader.list_runs(
            task=None, status=None, limit=50, cursor=deep_cursor
        ),
        "list filtered task+status": lambda: reader.list_runs(
            task="task-3", status="failed", limit=50, cursor=None
        ),
        "dispatch candidates (16)": lambda: reader.dispatch_candidates(limit=16),
    }


def run_scale(
    report: Report, *, label: str, urls: list[str], sizes: list[int], repeats: int
) -> None:
    """Time the same queries on one database per size (``urls[i]`` holds ``sizes[i]`` runs).

    The sizes are measured in turns, one sample of every query per size per round, so a
    slow phase of a shared machine lands on all sizes alike instead of on one.
    """
    engines = {size: _prepare(url, size) for url, size in zip(urls, sizes, strict=True)}
    try:
        queries = {size: _queries(engine) for size, engine in engines.items()}
        samples: dict[int, dict[str, list[float]]] = {
            size: {name: [] for name in q} for size, q in queries.items()
        }
        for _ in range(repeats):
            for size, q in queries.items():
                for name, fn in q.items():
                    samples[size][name].append(_time(fn))
        timings = {
            size: {name: median(values) for name, values in by_name.items()}
            for size, by_name in samples.items()
        }
    finally:
        for engine in engines.values():
            engine.dispose()
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


def _select_one(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
