"""Where a burst's CPU goes, process by process, through a real api and worker.

``python -m bench.cpu_split [--runs 600] [--pg URL]`` (standalone) starts a stack
(``bench/stack.py``), posts N ``/bin/true`` runs over 4 keep-alive clients until all are
terminal, and prints the machine's busy CPU per run and each process's share, in ms per run,
read from ``/proc`` before and after the burst:

- ``api``, ``worker``: the service's own processes (their threads included);
- ``zygote``: the shim fork server, with the first shim processes it reaped;
- ``reaped by pid 1``: the long-lived shims and their jobs. A shim's parent exits before it,
  so init reaps it and the CPU of the shim and its job reaches pid 1's children's times (read
  once pid 1 has no zombie child left, as it may reap late; a subreaper between them would
  hide it: then the machine's total says what no process accounts for);
- ``database``: the PostgreSQL server's backends (nothing with SQLite);
- ``bench client``: this process posting the runs.

Beside them, measured in the same run: the CPU of one bare ``posix_spawn`` + ``waitpid`` of
``/bin/true`` (what the job alone needs), and the figures as ratios to it.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from pathlib import Path

from app.worker.identity import stat_fields
from bench.profile_dispatch import cpu_jiffies, cpu_ticks, spawn_cpu_ms
from bench.stack import running_stack
from bench.trivial import enqueue_and_finish

_HZ = os.sysconf("SC_CLK_TCK")
# Init reaps exited shims when it gets to it; until then their CPU is in no process's times.
REAP_WAIT_S = 10.0


def _wait_reaped_by_init(timeout_s: float) -> None:
    """Until pid 1 has no zombie child (bounded; a warning when some are left)."""
    deadline = time.monotonic() + timeout_s
    while True:
        zombies = 0
        for name in os.listdir("/proc"):
            fields = stat_fields(int(name)) if name.isdigit() else None
            zombies += fields is not None and fields[0] == b"Z" and fields[1] == b"1"
        if not zombies:
            return
        if time.monotonic() > deadline:
            print(f"warning: {zombies} exited processes still unreaped by pid 1: "
                  "their CPU is missing from the split")  # fmt: skip
            return
        time.sleep(0.05)


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (own ticks, reaped children's ticks, command line) of every readable process."""
    seen: dict[int, tuple[int, int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = stat_fields(int(name))
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone, or not ours to read
        if fields is not None:
            seen[int(name)] = (*cpu_ticks(fields), cmdline)
    return seen


def _role(pid: int, cmdline: str) -> str | None:
    if pid == os.getpid():
        return "bench client"
    if "uvicorn" in cmdline and "app.api.main" in cmdline:
        return "api"
    if "-m app worker" in cmdline:
        return "worker"
    if "shim.py --zygote" in cmdline:
        return "zygote"
    if cmdline.startswith("postgres"):
        return "database"
    return None


def split(runs: int, pg: str | None) -> tuple[dict[str, float], dict[str, float]]:
    """(ms of CPU per run by role, the burst's figures)."""
    with running_stack(pg) as stack:
        before, (busy0, _) = _processes(), cpu_jiffies()
        got = enqueue_and_finish(stack, runs, 4)
        _wait_reaped_by_init(REAP_WAIT_S)
        after, (busy1, _) = _processes(), cpu_jiffies()
    ticks: collections.Counter[str] = collections.Counter()
    for pid, (own, children, cmdline) in after.items():
        own0, children0, _ = before.get(pid, (0, 0, ""))
        if pid == 1:
            ticks["reaped by pid 1"] += children - children0
            continue
        role = _role(pid, cmdline)
        if role is not None:
            ticks[role] += own - own0 + children - children0
    per_run = {role: 1000.0 * t / _HZ / runs for role, t in ticks.items()}
    per_run["machine busy"] = 1000.0 * (busy1 - busy0) / _HZ / runs
    return per_run, got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--pg", default=None, help="a PostgreSQL URL (default: SQLite)")
    args = parser.parse_args()
    os.umask(0o077)  # the data dir must be private, as the service makes it
    base = spawn_cpu_ms(300)
    per_run, got = split(args.runs, args.pg)
    print(f"{args.runs} runs, {got['runs_per_s']:.1f} runs/s "
          f"({'PostgreSQL' if args.pg else 'SQLite'}); baseline: one bare posix_spawn + "
          f"waitpid of /bin/true {base:.2f} ms CPU")  # fmt: skip
    order = ["machine busy", "api", "worker", "zygote", "reaped by pid 1", "database",
             "bench client"]  # fmt: skip
    for role in order:
        if role in per_run:
            ms = per_run[role]
            print(f"  {role:16s} {ms:6.2f} ms CPU per run = {ms / base:5.1f} bare spawns")


if __name__ == "__main__":
    main()
