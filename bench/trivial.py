"""Trivial runs: N `/bin/true` runs enqueued over HTTP until all are terminal.

Beside it, in the same run: raw ``os.posix_spawn`` + ``waitpid`` of ``/bin/true`` N times, and
the database's own commit rate (N one-row INSERT+COMMIT transactions through ``make_engine``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time

import httpx
from sqlalchemy import Engine, bindparam, text

from app.storage.engine import WRITE, make_engine
from bench.report import Figure, Report, percentile
from bench.stack import Stack, running_stack

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out", "lost")
PACED_RATE = 50.0  # issue 18's arrival rate for PostgreSQL: a steady load it keeps up with


def bare_spawn_ms(count: int, *, idle_s: float = 0.0) -> list[float]:
    """ms of each of ``count`` bare ``posix_spawn('/bin/true')`` + ``waitpid``, one by one,
    each after ``idle_s`` seconds asleep (a host's cold start after idle, bench/README.md)."""
    samples = []
    for _ in range(count):
        if idle_s:
            time.sleep(idle_s)
        t0 = time.perf_counter()
        pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
        os.waitpid(pid, 0)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def spawn_rate(count: int) -> float:
    """Runs/s of bare ``posix_spawn('/bin/true')`` + ``waitpid``, one after the other."""
    return count * 1000 / sum(bare_spawn_ms(count))


def commit_rate(url: str, count: int) -> float:
    """Transactions/s of one small INSERT + COMMIT each, with the service's engine settings."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE bench_commit (id INTEGER PRIMARY KEY, v TEXT)"))
        insert = text("INSERT INTO bench_commit (id, v) VALUES (:id, :v)").bindparams(
            bindparam("id"), bindparam("v")
        )
        t0 = time.perf_counter()
        for i in range(count):
            with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
                conn.execute(insert, {"id": i, "v": "x" * 64})
        rate = count / (time.perf_counter() - t0)
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE bench_commit"))
        return rate
    finally:
        engine.dispose()


def define_task(stack: Stack, task: str = "true") -> None:
    """PUT revision 1 of a `/bin/true` task."""
    r = httpx.put(
        f"{stack.base_url}/api/v1/tasks/{task}/revisions/1",
        json={"executor": "local_process", "argv": ["/bin/true"]},
        headers=stack.auth,
    )
    r.raise_for_status()


async def _enqueue(stack: Stack, count: int, clients: int, task: str) -> list[str]:
    """POST ``count`` runs over ``clients`` keep-alive connections; the ids, in no order.

    A bare HTTP/1.1 client on asyncio streams: httpx spent ~1.7 ms of CPU per POST on the
    same two cores as the system under test, a sixth of what one run costs it end to end.
    """
    ids: list[str] = []
    host, port = stack.base_url.removeprefix("http://").split(":")
    body = json.dumps({"task": task}).encode()
    head = (
        f"POST /api/v1/runs HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {stack.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()

    async def client(n: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for _ in range(n):
                writer.write(head + body)
                status = await reader.readline()
                length = None
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length is None:  # the api always sends one; anything else is not read here
                    raise RuntimeError(f"enqueue answered {status!r} without Content-Length")
                payload = await reader.readexactly(length)
                if status.split()[1] != b"201":
                    raise RuntimeError(f"enqueue answered {status!r}: {payload[:200]!r}")
                ids.append(json.loads(payload)["id"])
        finally:
            writer.close()
            await writer.wait_closed()

    share = [count // clients + (1 if i < count % clients else 0) for i in range(clients)]
    await asyncio.gather(*(client(n) for n in share))
    return ids


# The bench's own polls run on the machine they measure, so they are kept light: each one
# ends with COMMIT (``engine.begin``), because a ROLLBACK at the end of ``engine.connect``
# makes psycopg drop the connection's prepared statements, and the poll was planned anew
# every time (bench/README.md, "The bench's own polls"); the burst's poll sleeps longer
# while many runs are left.
POLL_NEAR_END_S = 0.01
POLL_FAR_S = 0.05


def wait_terminal(
    engine: Engine, count: int, timeout_s: float, far_s: float = POLL_FAR_S
) -> bool:
    """Poll the database until ``count`` runs are terminal (bounded): every 10 ms once at
    most a twentieth of them (or ten) is left, every ``far_s`` before (a caller whose runs
    may all end at once, as a recovery's do, passes ``POLL_NEAR_END_S``)."""
    query = text(f"SELECT count(*) FROM runs WHERE status IN {TERMINAL!r}")
    deadline = time.monotonic() + timeout_s
    near = max(10, count // 20)
    while time.monotonic() < deadline:
        with engine.begin() as conn:
            left = count - conn.execute(query).scalar_one()
        if left <= 0:
            return True
        time.sleep(POLL_NEAR_END_S if left <= near else far_s)
    return False


def enqueue_and_finish(stack: Stack, count: int, clients: int) -> dict[str, float]:
    """Enqueue ``count`` runs over HTTP and wait for all of them; return the figures."""
    define_task(stack)
    engine = make_engine(stack.url)
    try:
        t0 = time.perf_counter()
        asyncio.run(_enqueue(stack, count, clients, "true"))
        enqueued = time.perf_counter() - t0
        done = wait_terminal(engine, count, timeout_s=max(60.0, count / 5))
        elapsed = time.perf_counter() - t0
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT status, created_at_ms, started_at_ms FROM runs")
            ).all()
    finally:
        engine.dispose()
    lag = [float(r.started_at_ms - r.created_at_ms) for r in rows if r.started_at_ms]
    ok = sum(1 for r in rows if r.status == "succeeded")
    return {
        "runs_per_s": count / elapsed, "enqueue_per_s": count / enqueued,
        "p50": percentile(lag, 50), "p99": percentile(lag, 99),
        "succeeded": ok, "all_terminal": float(done), "elapsed_s": elapsed,
    }  # fmt: skip


def idle_latency(stack: Stack, count: int) -> list[float]:
    """created->started (ms) of ``count`` runs enqueued one at a time onto an idle system."""
    engine = make_engine(stack.url)
    lags = []
    try:
        with httpx.Client(base_url=stack.base_url, headers=stack.auth) as client:
            for _ in range(count):
                r = client.post("/api/v1/runs", json={"task": "true"})
                r.raise_for_status()
                query = text(
                    "SELECT created_at_ms, started_at_ms, status FROM runs WHERE id = :id"
                ).bindparams(id=r.json()["id"])
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    with engine.begin() as conn:
                        row = conn.execute(query).one()
                    if row.status in TERMINAL:
                        break
                    time.sleep(0.002)
                if row.started_at_ms:
                    lags.append(float(row.started_at_ms - row.created_at_ms))
    finally:
        engine.dispose()
    return lags


def paced_latency(stack: Stack, rate: float, count: int) -> list[float]:
    """created->started (ms) of ``count`` runs enqueued at ``rate`` per second (open loop).

    The burst above measures queueing: 1,000 runs arrive faster than they run, so most wait
    behind the others by construction. This is the start latency of a system kept below its
    capacity, with runs arriving steadily.
    """
    engine = make_engine(stack.url)
    ids: list[str] = []
    try:
        with httpx.Client(base_url=stack.base_url, headers=stack.auth) as client:
            t0 = time.perf_counter()
            for i in range(count):
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                r = client.post("/api/v1/runs", json={"task": "true"})
                r.raise_for_status()
                ids.append(r.json()["id"])
        query = text(
            "SELECT created_at_ms, started_at_ms, status FROM runs WHERE id IN :ids"
        ).bindparams(bindparam("ids", expanding=True))
        deadline = time.monotonic() + 60
        while True:
            with engine.connect() as conn:
                rows = conn.execute(query, {"ids": ids}).all() if ids else []
            if all(r.status in TERMINAL for r in rows):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("paced runs did not all end within 60 s")
            time.sleep(0.05)
    finally:
        engine.dispose()
    return [float(r.started_at_ms - r.created_at_ms) for r in rows if r.started_at_ms]


def run_trivial_group(
    report: Report,
    *,
    dbs: list[str | None],
    count: int,
    idle_count: int = 20,
    paced_count: int = 250,
    clients: int = 4,
    repeats: int = 1,
) -> None:
    """Add the trivial-run figures for each database of ``dbs`` (None: SQLite).

    With ``repeats`` > 1 the burst runs that many times, each on a fresh system, and the
    figures are the medians (one burst on a shared 2-CPU machine moves by ±10 %). The
    databases' bursts alternate, round by round, each first in turn (with an odd number of
    rounds SQLite is first once more): the
    PostgreSQL / SQLite ratio (issue 18) compares bursts of the same minutes, as every A/B
    on this host must (bench/README.md), not a SQLite phase with a PostgreSQL phase after
    it. The last round's stack of each database then measures its one-at-a-time and paced
    latencies and its commit rate.
    """
    bursts: dict[str | None, list[dict[str, float]]] = {db: [] for db in dbs}
    after: dict[str | None, tuple[list[float], list[float], float]] = {}
    for i in range(repeats):
        for db in dbs if i % 2 == 0 else dbs[::-1]:
            with running_stack(db) as stack:
                bursts[db].append(enqueue_and_finish(stack, count, clients))
                if i == repeats - 1:
                    idle = idle_latency(stack, idle_count)
                    paced = paced_latency(stack, PACED_RATE, paced_count)
                    after[db] = idle, paced, commit_rate(stack.url, count)
    for db in dbs:  # SQLite's figures first: PostgreSQL's ratio is to them
        _add_trivial(report, db, bursts[db], *after[db], count=count, clients=clients,
                     repeats=repeats)  # fmt: skip


def _add_trivial(
    report: Report,
    pg: str | None,
    bursts: list[dict[str, float]],
    idle: list[float],
    paced: list[float],
    commits: float,
    *,
    count: int,
    clients: int,
    repeats: int,
) -> None:
    label = "postgresql" if pg else "sqlite"
    got = {key: statistics.median(b[key] for b in bursts) for key in bursts[0]}
    spawns = spawn_rate(count)
    extra = {"n": count, "clients": clients, "repeats": repeats} | got
    extra["runs_per_s_each"] = [round(b["runs_per_s"], 1) for b in bursts]
    # Issue 18's targets only: SQLite's runs/s is judged against Celery in the peer group.
    report.add(Figure(f"{label} trivial runs to completion", got["runs_per_s"], "runs/s",
                      "posix_spawn+waitpid /bin/true", spawns, True, extra=extra))
    report.add(Figure(f"{label} trivial runs to completion", got["runs_per_s"], "runs/s",
                      "db commits (1 INSERT+COMMIT)", commits, True, extra=extra))
    sqlite_runs = [f.value for f in report.figures
                   if f.name == "sqlite trivial runs to completion"]
    if pg is not None and sqlite_runs:  # issue 18: PostgreSQL as fast as SQLite
        report.add(Figure("postgresql trivial runs to completion", got["runs_per_s"], "runs/s",
                          "sqlite trivial runs to completion", sqlite_runs[0], True,
                          target=">= 0.8x sqlite", extra=extra))
    report.add(Figure(f"{label} enqueue over HTTP ({clients} clients)", got["enqueue_per_s"],
                      "runs/s", "db commits (1 INSERT+COMMIT)", commits, True))
    report.add(Figure(f"{label} created->started p50, {count:,} at once (queueing)",
                      got["p50"], "ms", "1 / db commit rate", 1000 / commits, False))
    report.add(Figure(f"{label} created->started p99, {count:,} at once (queueing)",
                      got["p99"], "ms", "1 / db commit rate", 1000 / commits, False))
    report.add(Figure(f"{label} created->started p50, {PACED_RATE:g} runs/s arriving",
                      percentile(paced, 50), "ms", "1 / db commit rate", 1000 / commits, False,
                      target="" if pg is None else "<= 20 ms",
                      extra={"n": len(paced), "rate": PACED_RATE}))
    report.add(Figure(f"{label} created->started p99, {PACED_RATE:g} runs/s arriving",
                      percentile(paced, 99), "ms", "1 / db commit rate", 1000 / commits, False,
                      extra={"n": len(paced), "rate": PACED_RATE}))
    report.add(Figure(f"{label} created->started p50, one run at a time", percentile(idle, 50),
                      "ms", "1 / db commit rate", 1000 / commits, False,
                      target="<= 5 ms" if pg is None else "<= 8 ms",
                      extra={"n": len(idle), "p99": percentile(idle, 99)}))
