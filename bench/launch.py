"""Launch latency: through the worker socket (journal + shim) vs a bare posix_spawn.

``python -m bench.launch [--count N]`` starts a real ``qinglong worker`` on a fresh SQLite
data dir, arms N runs (untimed), then times ``WorkerClient.launch`` of ``/bin/true`` end to
end (socket round trip, journal reserve + record commits, shim start-up, status line), and
the same launch in-process (no socket), beside ``os.posix_spawn('/bin/true')`` + wait.
Printed and recorded under bench/results/; nothing is asserted.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.adapters.worker_client import WorkerClient
from app.domain.execution import LaunchRequest
from app.domain.ids import uuid7
from app.domain.model import ProcessHandle
from app.storage.engine import make_engine
from app.storage.journal_repo import JournalRepository
from app.storage.migrate import upgrade_to_head
from app.worker.identity import wait_exit
from app.worker.launcher import ShimLauncher
from app.worker.receipts import ReceiptStore
from bench.report import Figure, Report, median, percentile
from bench.stack import start_worker, stop
from bench.trivial import bare_spawn_ms, commit_rate
from tests.worker.kit import armed_run, launch_request, make_log

ROOT = Path(__file__).resolve().parents[1]
FAKE = ProcessHandle(boot_id="b", pid=1, pgid=1, start_ticks=1, shim_pid=1, shim_start_ticks=1)


def run_launch(report: Report, *, count: int) -> None:
    """Measure and add the three figures."""
    tmp = Path(tempfile.mkdtemp(prefix="qlb"))
    data = tmp / "data"
    data.mkdir(mode=0o700)
    url = f"sqlite:///{data / 'qinglong.db'}"
    engine = make_engine(url)
    upgrade_to_head(engine)
    proc = start_worker(data, url)
    client = WorkerClient(data / "worker.sock")
    shims: list[int] = []
    try:
        def one(launch: Callable[[LaunchRequest], ProcessHandle]) -> float:
            armed = armed_run(engine)
            log = make_log(data / "logs", armed.attempt_id)
            request = launch_request(armed, argv=["/bin/true"], log_path=log)
            t0 = time.perf_counter()
            handle = launch(request)
            elapsed = (time.perf_counter() - t0) * 1000
            shims.append(handle.shim_pid)
            return elapsed

        socket_ms = [one(client.launch) for _ in range(count)]
        local = ShimLauncher(
            journal=JournalRepository(engine), receipts=ReceiptStore(data / "receipts")
        )
        local_ms = [one(local.launch) for _ in range(count)]
        local.close()  # its shim zygote exits; the shims it forked finish on their own
        bare_ms = bare_spawn_ms(count)
        journal = JournalRepository(engine)
        journal_ms = []
        for _ in range(count):
            attempt = uuid7()
            t0 = time.perf_counter()
            journal.reserve(attempt_id=attempt, run_id=uuid7(), receipt_ref="bench")
            journal.record_spawned(attempt_id=attempt, handle=FAKE)
            journal_ms.append((time.perf_counter() - t0) * 1000)
        python_ms = []
        for _ in range(count):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
            python_ms.append((time.perf_counter() - t0) * 1000)
        base = median(bare_ms)
        report.add(Figure("launch via worker socket, median", median(socket_ms), "ms",
                          "posix_spawn /bin/true + wait, median", base, False,
                          extra={"p95": percentile(socket_ms, 95), "n": count}))
        report.add(Figure("launch in-process (no socket), median", median(local_ms), "ms",
                          "posix_spawn /bin/true + wait, median", base, False,
                          extra={"p95": percentile(local_ms, 95), "n": count}))
        report.add(Figure("  of which: journal reserve+spawned commits", median(journal_ms), "ms",
                          "posix_spawn /bin/true + wait, median", base, False))
        two_commits = 2 * 1000 / commit_rate(url, count)  # its own table in the same database
        report.add(Figure("  journal reserve+spawned commits", median(journal_ms), "ms",
                          "2 db commits (1 INSERT+COMMIT each)", two_commits, False))
        report.add(Figure("  of which: bare `python -I -S` start+exit", median(python_ms), "ms",
                          "posix_spawn /bin/true + wait, median", base, False))
    finally:
        for pid in shims:
            wait_exit(pid, 10.0)
        client.close()
        stop(proc)
        engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=30)
    args = parser.parse_args()
    report = Report()
    run_launch(report, count=args.count)
    report.write("launch")


if __name__ == "__main__":
    main()
