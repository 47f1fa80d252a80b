"""API reads: GET one run and one list page vs GET /healthz on the same server, under load.

The load generator is wrk (Debian's package) when installed, else an httpx-based async one.
Every measurement is bounded (``seconds``) and targets 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import subprocess
import time

import httpx

from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.runs_repo import RunRepository
from bench.report import Figure, Report, percentile
from bench.stack import Stack, running_stack

_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _wrk(url: str, headers: dict[str, str], seconds: float, connections: int) -> dict[str, float]:
    argv = ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    for key, value in headers.items():
        argv += ["-H", f"{key}: {value}"]
    out = subprocess.run(
        [*argv, url], capture_output=True, text=True, check=True, timeout=seconds + 30
    ).stdout

    def latency(pct: str) -> float:
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        return float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {
        "rps": float(rps.group(1)) if rps else float("nan"),
        "p50": latency("50"), "p99": latency("99"),
        "errors": float(non2xx.group(1)) if non2xx else 0.0,
    }  # fmt: skip


async def _httpx_load(
    url: str, headers: dict[str, str], seconds: float, connections: int
) -> dict[str, float]:
    samples: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal errors
        async with httpx.AsyncClient(headers=headers) as c:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                r = await c.get(url)
                samples.append((time.perf_counter() - t0) * 1000)
                errors += r.status_code >= 300

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(connections)))
    elapsed = time.perf_counter() - t0
    return {
        "rps": len(samples) / elapsed, "p50": percentile(samples, 50),
        "p99": percentile(samples, 99), "errors": float(errors),
    }  # fmt: skip


def load(
    url: str, headers: dict[str, str], seconds: float, connections: int = 16
) -> dict[str, float]:
    """req/s, p50 and p99 (ms) of GET ``url`` for ``seconds``."""
    if shutil.which("wrk"):
        return _wrk(url, headers, seconds, connections)
    return asyncio.run(_httpx_load(url, headers, seconds, connections))


def _fill(stack: Stack, count: int) -> str:
    engine = make_engine(stack.url)
    try:
        DefinitionRepository(engine).put_revision(
            task="true", revision=1, executor="local_process", argv=["/bin/true"],
            cwd=None, recipe=None, timeout_seconds=None, priority=0,
        )  # fmt: skip
        runs = RunRepository(engine)
        run_id = ""
        for _ in range(count):
            run_id = runs.enqueue_run(task="true", revision=None, priority=None)[0].id
        return run_id
    finally:
        engine.dispose()


def _median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def run_api_reads(report: Report, *, pg: str | None, seconds: float, runs: int = 200) -> None:
    """Add req/s, p50 and p99 of the two reads beside the trivial route.

    The three targets are loaded in turns, one second each, for ``seconds`` rounds, and each
    figure is the median over the rounds: the baseline and the reads see the same moments of
    a shared machine instead of one getting a quiet second and the other a busy one.
    """
    label = "postgresql" if pg else "sqlite"
    generator = "wrk" if shutil.which("wrk") else "httpx"
    with running_stack(pg, worker=False) as stack:
        run_id = _fill(stack, runs)
        api = f"{stack.base_url}/api/v1/runs"
        targets = {
            "baseline": f"{stack.base_url}/healthz",
            "GET one run": f"{api}/{run_id}",
            "GET list page (50)": f"{api}?limit=50",
        }
        for url in targets.values():
            httpx.get(url, headers=stack.auth).raise_for_status()  # warm
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        for _ in range(max(1, round(seconds))):
            for name, url in targets.items():
                rounds[name].append(load(url, stack.auth, 1.0))
    base = _median_of(rounds.pop("baseline"))
    for name, samples in rounds.items():
        fig = _median_of(samples)
        extra = {"generator": generator, "rounds": len(samples), "errors": fig["errors"],
                 "baseline_errors": base["errors"]}  # fmt: skip
        report.add(Figure(f"{label} {name} req/s", fig["rps"], "req/s", "GET /healthz req/s",
                          base["rps"], True,
                          target=">= 0.5x" if name == "GET one run" else "", extra=extra))
        report.add(Figure(f"{label} {name} p50", fig["p50"], "ms", "GET /healthz p50",
                          base["p50"], False, extra=extra))
        report.add(Figure(f"{label} {name} p99", fig["p99"], "ms", "GET /healthz p99",
                          base["p99"], False, extra=extra))
