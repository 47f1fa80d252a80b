"""Profile the slowest path of the trivial-run benchmark: the api's dispatcher drain.

``python -m bench.profile_dispatch [--count N] [--pg URL]`` starts a real worker, enqueues N
``/bin/true`` runs through the repository (untimed), then drains them in this process under
pyinstrument with the api's own wiring (``build_execution``): candidates page, materialize,
T1, launch over the worker socket (journal + shim start-up), T2. The text profile goes to
stdout (and ``--html PATH`` if asked); the per-run time is printed as a figure beside a bare
``posix_spawn`` + ``waitpid`` of ``/bin/true`` measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from app.context.execution_wiring import build_execution
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.private_files import SERVICE_UMASK
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.secret_crypto import KeyRing
from app.storage.secrets_repo import SecretRepository
from app.worker.identity import stat_fields
from bench.report import Figure, Report
from bench.stack import database, start_worker, stop
from bench.trivial import bare_spawn_ms, spawn_rate, wait_terminal


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def proc_cpu(pid: int) -> tuple[int, int]:
    """(utime+stime, cutime+cstime) of ``pid`` in clock ticks."""
    f = stat_fields(pid)
    assert f is not None, f"no process {pid}"
    return cpu_ticks(f)


def cpu_ticks(fields: list[bytes]) -> tuple[int, int]:
    """(utime+stime, cutime+cstime) in clock ticks from ``stat_fields``' fields."""
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def profile_drain(*, count: int, pg: str | None, html: str | None) -> dict[str, float]:
    """Drain ``count`` queued runs once under pyinstrument; print the profile."""
    from pyinstrument import Profiler

    tmp = Path(tempfile.mkdtemp(prefix="qlb"))
    data = tmp / "d"
    data.mkdir(mode=0o700)
    try:
        with database(pg, data) as url:
            worker = start_worker(data, url)
            engine = make_engine(url)
            try:
                settings = Settings.from_env({"QL_DATA_DIR": str(data), "QL_DATABASE_URL": url})
                DefinitionRepository(engine).put_revision(
                    task="true", revision=1, executor="local_process", argv=["/bin/true"],
                    cwd=None, recipe=None, timeout_seconds=None, priority=0,
                )  # fmt: skip
                runs = RunRepository(engine)
                for _ in range(count):
                    runs.enqueue_run(task="true", revision=None, priority=None)
                ring = KeyRing.from_settings(secret_key=None, key_file=settings.key_file)
                hooks = build_execution(
                    settings, candidates=RunReader(engine),
                    definitions=DefinitionRepository(engine),
                    secrets=SecretRepository(engine, ring), transitions=runs,
                )  # fmt: skip
                profiler = Profiler(interval=0.0005)
                w0 = proc_cpu(worker.pid)
                cpu0 = cpu_jiffies()
                self0 = os.times()
                t0 = time.perf_counter()
                profiler.start()
                hooks.drain()
                profiler.stop()
                drained = time.perf_counter() - t0
                self1 = os.times()
                busy, total = (b - a for a, b in zip(cpu0, cpu_jiffies(), strict=True))
                own = self1.user + self1.system - self0.user - self0.system
                wait_terminal(engine, count, timeout_s=60)
                with engine.connect() as conn:
                    query = text("SELECT status, count(*) FROM runs GROUP BY status")
                    statuses: dict[str, int] = {r[0]: r[1] for r in conn.execute(query)}
                w1 = proc_cpu(worker.pid)
                tick = os.sysconf("SC_CLK_TCK")
                print(f"run statuses after the drain: {statuses}")
                hooks.close()
                print(profiler.output_text(unicode=True, color=False, show_all=False))
                if html:
                    Path(html).write_text(profiler.output_html())
                return {
                    "drain_ms_per_run": drained * 1000 / count,
                    "machine_busy_pct": 100 * busy / total,
                    "self_cpu_ms_per_run": 1000 * own / count,
                    "worker_cpu_ms_per_run": 1000 * (w1[0] - w0[0]) / tick / count,
                    "worker_children_cpu_ms_per_run": 1000 * (w1[1] - w0[1]) / tick / count,
                }
            finally:
                engine.dispose()
                stop(worker)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--pg", default=None)
    parser.add_argument("--html", default=None)
    args = parser.parse_args()
    os.umask(SERVICE_UMASK)  # the service's own files must be private, as under `qinglong`
    got = profile_drain(count=args.count, pg=args.pg, html=args.html)
    spawn_cpu = spawn_cpu_ms(args.count)
    report = Report()
    report.add(Figure("dispatcher drain per run (profiled)", got["drain_ms_per_run"], "ms",
                      "posix_spawn+waitpid /bin/true", 1000 / spawn_rate(args.count), False,
                      extra={"machine_busy_pct": got["machine_busy_pct"]}))
    for name, key in (("this process (dispatch)", "self_cpu_ms_per_run"),
                      ("the worker", "worker_cpu_ms_per_run"),
                      ("the worker's reaped children", "worker_children_cpu_ms_per_run")):
        report.add(Figure(f"CPU per run: {name}", got[key], "ms",
                          "CPU of posix_spawn+waitpid /bin/true", spawn_cpu, False))


def spawn_cpu_ms(count: int) -> float:
    """CPU (this process and its reaped children) per bare posix_spawn+waitpid of /bin/true."""
    t0 = os.times()
    bare_spawn_ms(count)
    t1 = os.times()
    spent = sum(b - a for a, b in zip(t0[:4], t1[:4], strict=True))
    return 1000 * spent / count


if __name__ == "__main__":
    main()
