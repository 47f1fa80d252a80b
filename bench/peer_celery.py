"""The peer a user would pick instead: Celery on the same ``/bin/true`` job, in the same run.

Celery 5 (prefork pool, concurrency 2, Redis broker on 127.0.0.1:6379), each job
``subprocess.run(["/bin/true"])``, against our own trivial runs measured right before it on a
fresh SQLite service (and PostgreSQL with ``--postgres``). Two figures each, printed as ours
beside Celery's (the ratio is ours / Celery's):

- jobs to completion (a burst of N sent at once, until the last one finished);
- idle enqueue→start p50 (one job at a time on an idle system).

Celery keeps no durable exit record here (no result backend, as its default): the job
appends its start lag to a Redis list, which is how the bench counts completions. It is a
bench extra (``pip install -e '.[bench]'``), never a runtime dependency; without Celery or
without a Redis server answering, the group is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import IO

from bench.report import Figure, Report, percentile

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_DB = 15  # the bench's own database index on the shared server; keys are per run
CONCURRENCY = 2


def skip_reason() -> str | None:
    """Why the peer cannot run here, or None."""
    try:
        import celery  # noqa: F401
        import redis  # noqa: F401
    except ImportError as exc:
        return f"celery/redis not installed ({exc.name}); pip install -e '.[bench]'"
    with socket.socket() as sock:
        sock.settimeout(1)
        try:
            sock.connect((REDIS_HOST, REDIS_PORT))
        except OSError:
            return f"no Redis server answers on {REDIS_HOST}:{REDIS_PORT}"
    return None


def _app(queue: str, key: str):  # type: ignore[no-untyped-def]
    from celery import Celery

    app = Celery("qlbench", broker=f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}")
    app.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        worker_prefetch_multiplier=4,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name="qlbench.true_job")
    def true_job(enqueued_at: float) -> None:
        started = time.time()
        subprocess.run(["/bin/true"], check=False)
        _redis().rpush(key, json.dumps(started - enqueued_at))

    return app, true_job


def _redis():  # type: ignore[no-untyped-def]
    import redis

    return redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB)


@contextlib.contextmanager
def _worker(queue: str, key: str) -> Iterator[tuple[subprocess.Popen[bytes], IO[bytes]]]:
    env = dict(os.environ, QLBENCH_QUEUE=queue, QLBENCH_KEY=key)
    argv = [sys.executable, "-m", "celery", "-A", "bench.peer_celery_worker", "worker",
            "--pool", "prefork", "--concurrency", str(CONCURRENCY), "--loglevel", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-Q", queue]  # fmt: skip
    # Its stderr goes to a file, never a pipe nobody reads (a full pipe would stall it).
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=errors)
    try:
        yield proc, errors
    finally:
        proc.send_signal(signal.SIGTERM)  # warm shutdown of the pool, then the main process
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        errors.close()


def _wait_len(r, key: str, n: int, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if r.llen(key) >= n:
            return True
        time.sleep(0.001)
    return False


def _rss_mb(pid: int) -> float:
    """RSS of ``pid`` and its children (the pool), MB."""
    total = 0
    pids = [pid]
    with contextlib.suppress(OSError):
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()  # noqa: SIM115
        pids += [int(c) for c in children]
    for p in pids:
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def measure_celery(count: int, idle_count: int) -> dict[str, float]:
    """Celery's figures: burst jobs/s, idle enqueue->start p50 (ms), idle RSS (MB)."""
    run_id = uuid.uuid4().hex[:12]
    queue, key = f"qlbench-{run_id}", f"qlbench:{run_id}:lag"
    _, true_job = _app(queue, key)
    r = _redis()
    r.delete(key)
    try:
        with _worker(queue, key) as (proc, errors):
            # Ready when a warm-up job has run end to end.
            true_job.apply_async((time.time(),))
            if not _wait_len(r, key, 1, 60):
                errors.seek(0)
                err = errors.read()[-500:]
                raise RuntimeError(f"the celery worker did not run a job: {err!r}")
            time.sleep(1.0)
            rss = _rss_mb(proc.pid)
            r.delete(key)
            idle = []
            for i in range(idle_count):
                true_job.apply_async((time.time(),))
                if not _wait_len(r, key, i + 1, 30):
                    raise RuntimeError("celery idle job did not run within 30 s")
                time.sleep(0.02)
            idle = [json.loads(v) * 1000 for v in r.lrange(key, 0, -1)]
            r.delete(key)
            t0 = time.perf_counter()
            for _ in range(count):
                true_job.apply_async((time.time(),))
            if not _wait_len(r, key, count, max(60.0, count / 5)):
                raise RuntimeError("celery burst did not finish")
            elapsed = time.perf_counter() - t0
    finally:
        r.delete(key)
        r.delete(queue)
        r.close()
    return {"runs_per_s": count / elapsed, "idle_p50": percentile(idle, 50), "rss_mb": rss}


def run_peer(report: Report, *, pg: str | None, count: int, idle_count: int) -> None:
    """Our trivial burst and idle latency, then Celery's, on this machine now."""
    from bench.stack import running_stack
    from bench.trivial import enqueue_and_finish, idle_latency

    reason = skip_reason()
    if reason is not None:
        print(f"   peer skipped: {reason}", flush=True)
        return
    ours: dict[str, dict[str, float]] = {}
    for label, db in [("sqlite", None)] + ([("postgresql", pg)] if pg else []):
        with running_stack(db) as stack:
            burst = enqueue_and_finish(stack, count, 4)
            idle = idle_latency(stack, idle_count)
        ours[label] = {"runs_per_s": burst["runs_per_s"], "idle_p50": percentile(idle, 50)}
    celery = measure_celery(count, idle_count)
    extra = {"n": count, "idle_n": idle_count, "celery_rss_mb": round(celery["rss_mb"], 1)}
    for label, got in ours.items():
        report.add(Figure(f"{label} trivial runs to completion", got["runs_per_s"], "runs/s",
                          f"celery prefork c={CONCURRENCY} (redis)", celery["runs_per_s"], True,
                          target=">= 1.1x celery" if label == "sqlite" else "", extra=extra))
        report.add(Figure(f"{label} idle created->started p50", got["idle_p50"], "ms",
                          "celery idle enqueue->start p50", celery["idle_p50"], False,
                          target="<= 5 ms" if label == "sqlite" else "<= 8 ms", extra=extra))
    print(f"   celery worker idle RSS (main process + pool): {celery['rss_mb']:.1f} MB", flush=True)
