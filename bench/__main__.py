"""``python -m bench [--quick|--full] [--only NAME ...] [--postgres URL]``.

Runs the benchmark groups below, prints every figure beside its same-run baseline and the
ratio, and writes them all to ``bench/results/<label>-<time>.json``. PostgreSQL groups run
when ``--postgres`` (default ``$QL_TEST_POSTGRES_URL``) is given, each in a private schema
dropped afterwards. Nothing is asserted: targets are printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.storage.private_files import SERVICE_UMASK
from bench.report import Report


@dataclass(frozen=True)
class Sizes:
    """How much work each group does in one mode."""

    trivial_runs: int
    trivial_repeats: int
    idle_runs: int
    paced_runs: int
    read_seconds: float
    scale: list[int]
    scale_repeats: int
    shim_count: int
    drain_bytes: int
    receipts: int
    launch_count: int
    schedule_fires: int
    idle_schedules: int
    idle_window_s: float
    # Retention (bench/retention.py): logs expired in the sweep figure, runs in the list one.
    retention_expired: int = 1_000
    retention_runs: int = 10_000


QUICK = Sizes(trivial_runs=100, trivial_repeats=1, idle_runs=10, paced_runs=50, read_seconds=1.5,
              scale=[1_000, 5_000],
              scale_repeats=5, shim_count=10, drain_bytes=50_000_000, receipts=300,
              launch_count=10, schedule_fires=20, idle_schedules=10_000,
              idle_window_s=5.0)  # fmt: skip
FULL = Sizes(trivial_runs=1_000, trivial_repeats=3, idle_runs=50, paced_runs=250, read_seconds=5.0,
             scale=[1_000, 10_000, 100_000],
             scale_repeats=20, shim_count=30, drain_bytes=200_000_000, receipts=1_000,
             launch_count=30, schedule_fires=120, idle_schedules=10_000,
             idle_window_s=10.0, retention_expired=5_000, retention_runs=100_000)  # fmt: skip


# Groups a plain --quick leaves out (name them with --only): the schedule rows wait for
# real seconds (a fire per second, idle windows), which no size makes short.
FULL_ONLY = frozenset({"launch", "schedules"})


def _groups(size: Sizes, pg: str | None) -> dict[str, Callable[[Report], None]]:
    from bench.api_reads import run_api_reads
    from bench.http_protocol import run_http_protocol
    from bench.launch import run_launch
    from bench.peer_celery import run_peer
    from bench.recovery import run_recovery
    from bench.retention import run_retention
    from bench.schedules import run_fire_lateness, run_idle_cpu
    from bench.shim import run_shim
    from bench.trivial import run_trivial_group

    dbs: list[str | None] = [None] + ([pg] if pg else [])

    def each(fn: Callable[..., None], **kw: object) -> Callable[[Report], None]:
        def run(report: Report) -> None:
            for db in dbs:
                fn(report, pg=db, **kw)

        return run

    return {
        # SQLite's and PostgreSQL's bursts alternate (bench/trivial.py): one ratio, one time.
        "trivial": lambda report: run_trivial_group(
            report,
            dbs=dbs,
            count=size.trivial_runs,
            idle_count=size.idle_runs,
            paced_count=size.paced_runs,
            repeats=size.trivial_repeats,
        ),
        "reads": each(run_api_reads, seconds=size.read_seconds),
        "http": lambda report: run_http_protocol(report, seconds=size.read_seconds),
        "scale": lambda report: _scale(report, size, pg),
        "shim": lambda report: run_shim(
            report, count=size.shim_count, drain_bytes=size.drain_bytes
        ),
        "recovery": each(run_recovery, count=size.receipts),
        "launch": lambda report: run_launch(report, count=size.launch_count),
        # Celery on the same job (bench/peer_celery.py); skipped with the reason without it.
        "peer": lambda report: run_peer(
            report, pg=pg, count=size.trivial_runs, idle_count=size.idle_runs
        ),
        "schedules": lambda report: (
            each(run_fire_lateness, fires=size.schedule_fires)(report),
            each(run_idle_cpu, count=size.idle_schedules, window_s=size.idle_window_s)(report),
        ),
        "retention": lambda report: run_retention(
            report,
            expired=size.retention_expired,
            list_runs=size.retention_runs,
            repeats=size.scale_repeats * 5,
        ),
    }


def _scale(report: Report, size: Sizes, pg: str | None) -> None:
    import contextlib
    import tempfile
    from pathlib import Path

    from bench.scale import run_scale
    from bench.stack import database

    with tempfile.TemporaryDirectory(prefix="ql-bench-scale-") as tmp:
        urls = [f"sqlite:///{Path(tmp) / f'scale-{n}.db'}" for n in size.scale]
        run_scale(report, label="sqlite", urls=urls, sizes=size.scale, repeats=size.scale_repeats)
    if pg:
        with contextlib.ExitStack() as stack:  # private schemas, dropped afterwards
            urls = [stack.enter_context(database(pg, Path("/"))) for _ in size.scale]
            run_scale(
                report, label="postgresql", urls=urls, sizes=size.scale,
                repeats=size.scale_repeats,
            )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes (under a minute)")
    mode.add_argument("--full", action="store_true", help="full sizes (the README table)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only these groups (repeatable)")
    parser.add_argument("--postgres", default=os.environ.get("QL_TEST_POSTGRES_URL"),
                        help="PostgreSQL URL (default $QL_TEST_POSTGRES_URL)")
    args = parser.parse_args(argv)
    # The bench prepares databases for the api and the worker, which refuse files group or
    # others can read (app/storage/private_files.py): make them as the service would.
    os.umask(SERVICE_UMASK)
    size = FULL if args.full else QUICK
    label = "full" if args.full else "quick"
    groups = _groups(size, args.postgres or None)
    unknown = [name for name in args.only if name not in groups]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; choose from {', '.join(groups)}")
    chosen = args.only or [name for name in groups if name not in FULL_ONLY or args.full]
    report = Report()
    print(f"bench --{label}: {', '.join(chosen)}"
          f" (postgres: {'yes' if args.postgres else 'no'}; {os.cpu_count()} cpus)")
    t0 = time.perf_counter()
    try:
        for name in chosen:
            print(f"-- {name}", flush=True)
            groups[name](report)
    finally:
        if report.figures:
            report.write(label)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
