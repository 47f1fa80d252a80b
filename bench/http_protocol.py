"""The cost of the service's HTTP protocol (limits, retirement, framing) on the request path.

Three uvicorn processes serve the same app on one data dir: with uvicorn's own httptools
protocol, with the service's protocol without the limits (``WithoutLimits``, the baseline
of what the limits cost) and with ``RetiringHttpToolsProtocol`` (docs/http-limits.md). A
raw-socket asyncio client loads ``GET /healthz`` on each in turns, one second a turn, on
keep-alive connections and with a fresh connection per request (which also pays the
per-connection bookkeeping); each figure is the median over the turns. The server's CPU
time per request (from the scheduler, all threads) is the figure to read on a shared host:
req/s there moves with everyone else's load.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from pathlib import Path

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.framing import ProblemFraming
from app.api.retirement import _Retiring
from bench.report import Figure, Report
from bench.stack import free_port, running_stack, start_api, stop

CLIENTS = 8
PROTOCOLS = {
    "uvicorn httptools": "httptools",
    "retirement+framing": "bench.http_protocol:WithoutLimits",
    "RetiringHttpToolsProtocol": "app.api.retirement:RetiringHttpToolsProtocol",
}


class WithoutLimits(ProblemFraming, _Retiring, HttpToolsProtocol):
    """The service's protocol before issue 13 §2: what the limits alone cost is the ratio."""


_KEEP = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"
_CLOSE = b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"


async def _keep_alive(port: int, deadline: float) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        while time.perf_counter() < deadline:
            writer.write(_KEEP)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            done += 1
    finally:
        writer.close()
    return done


async def _fresh(port: int, deadline: float) -> int:
    done = 0
    while time.perf_counter() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_CLOSE)
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
        writer.close()
        done += 1
    return done


def _cpu_ns(pid: int) -> int:
    """Nanoseconds ``pid`` (all its threads) has run on a CPU (the scheduler's own count)."""
    return sum(
        int(path.read_text().split()[0]) for path in Path(f"/proc/{pid}/task").glob("*/schedstat")
    )


def _turn(kind: str, pid: int, port: int, seconds: float) -> tuple[float, float]:
    """(req/s, server CPU µs per request) of one turn."""

    async def main() -> int:
        client = _keep_alive if kind == "keep-alive" else _fresh
        deadline = time.perf_counter() + seconds
        return sum(await asyncio.gather(*(client(port, deadline) for _ in range(CLIENTS))))

    cpu0, t0 = _cpu_ns(pid), time.perf_counter()
    done = asyncio.run(main())
    elapsed, cpu = time.perf_counter() - t0, _cpu_ns(pid) - cpu0
    return done / elapsed, cpu / 1000 / max(done, 1)


def run_http_protocol(report: Report, *, seconds: float) -> None:
    """Add req/s of /healthz on the service's protocol beside uvicorn's own, same run."""
    with running_stack(None, worker=False) as stack:
        procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        try:
            for name, http in PROTOCOLS.items():
                port = free_port()
                procs[name] = (start_api(stack.data, stack.url, port, http=http), port)
            rounds: dict[tuple[str, str], list[tuple[float, float]]] = {}
            names = list(procs)
            for turn in range(max(1, round(seconds))):
                # A different one goes first each turn: a shared host's load drifts by the second.
                order = names[turn % len(names) :] + names[: turn % len(names)]
                for kind in ("keep-alive", "fresh connection"):
                    for name in order:
                        proc, port = procs[name]
                        rounds.setdefault((kind, name), []).append(_turn(kind, proc.pid, port, 1.0))
        finally:
            for proc, _ in procs.values():
                stop(proc)
    uvicorn_own, before, ours = list(PROTOCOLS)

    def median(kind: str, name: str, which: int) -> float:
        return statistics.median(turn[which] for turn in rounds[(kind, name)])

    for kind in ("keep-alive", "fresh connection"):
        extra = {"rounds": len(rounds[(kind, ours)]), "clients": CLIENTS}
        for base_name in (before, uvicorn_own):
            report.add(Figure(f"server CPU per GET /healthz, {kind}, {ours}",
                              median(kind, ours, 1), "us", f"{base_name} us",
                              median(kind, base_name, 1), False, extra=extra))  # fmt: skip
        report.add(Figure(f"GET /healthz req/s, {kind}, {ours}", median(kind, ours, 0), "req/s",
                          f"{before} req/s", median(kind, before, 0), True,
                          extra=extra))  # fmt: skip
