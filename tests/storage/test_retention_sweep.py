"""The retention sweep on real files and a real database (docs/retention.md §3, §5).

The crash test seeds 10,000 finished runs with real log files, runs the sweep in a real
subprocess, SIGKILLs it while logs are ``expiring`` (between the database mark and the
record that the unlinks are durable), checks that nothing dangles, reruns the sweep and
checks the budgets.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update

from app.domain.ids import now_ms
from app.domain.retention import GlobalBudgets, RetentionPolicy
from app.storage.engine import make_engine
from app.storage.retention_repo import RetentionRepository
from app.storage.tables import attempts, runs
from app.worker.log_retention import LogSweep
from tests.disk import MIB, free_bytes, mounted_tmpfs
from tests.kit.processes import Processes, wait_all_threads_stopped
from tests.storage.retention_kit import DAY_MS, counts, fast_fs, file_and_row_agree, seed

POLICY = RetentionPolicy(keep_runs=700, keep_days=0, keep_rows=800, task_log_bytes=None)
_SWEEPER = """
import sys
from pathlib import Path
from app.domain.retention import GlobalBudgets, RetentionPolicy
from app.storage.engine import make_engine
from app.storage.retention_repo import RetentionRepository
from app.worker.log_retention import LogSweep

url, root = sys.argv[1], Path(sys.argv[2])
repo = RetentionRepository(make_engine(url))
sweep = LogSweep(
    repo=repo, logs_root=root,
    policy=RetentionPolicy(keep_runs=700, keep_days=0, keep_rows=800, task_log_bytes=None),
    budgets=GlobalBudgets(total_log_bytes=None, free_reserve_bytes=0),
    tasks_per_pass=10, files_per_pass=2000,
)
while True:
    sweep.run_pass()
"""


def _sweep(engine: Engine, root: Path, policy: RetentionPolicy, budgets: GlobalBudgets) -> LogSweep:
    return LogSweep(
        repo=RetentionRepository(engine),
        logs_root=root,
        policy=policy,
        budgets=budgets,
        tasks_per_pass=10,
        files_per_pass=2000,
    )


def _until_quiet(sweep: LogSweep, passes: int = 40) -> list[int]:
    done = []
    idle = 0
    for _ in range(passes):
        r = sweep.run_pass()
        done.append(r.expired_logs + r.finished_expiring + r.deleted_runs)
        idle = idle + 1 if done[-1] == 0 else 0
        if idle >= 2:
            return done
    raise AssertionError(f"the sweep did not settle: {done}")


def _expiring(engine: Engine) -> int:
    with engine.connect() as conn:
        q = select(func.count()).select_from(attempts).where(attempts.c.log_state == "expiring")
        return int(conn.execute(q).scalar() or 0)


# SQLite only, its file beside the logs on a tmpfs: on the shared host's disk and on the
# shared PostgreSQL server the same 10,000 runs cost 20-40 s (the CI budget). The same sweep
# code runs on PostgreSQL in the pinned test below and end to end in
# tests/e2e/test_retention_serve.py.
def test_a_sweep_killed_9_midway_then_rerun_leaves_no_orphan_no_dangling_row_and_meets_budgets(
    sqlite_template: Path, tmp_path: Path, procs: Processes
) -> None:
    with fast_fs(tmp_path / "fs") as fs:
        shutil.copyfile(sqlite_template, fs / "qinglong.db")
        url = f"sqlite:///{fs / 'qinglong.db'}"
        engine = make_engine(url)
        try:
            _killed_then_rerun(engine, url, fs / "logs", procs)
        finally:
            engine.dispose()


def _kill_while_expiring(engine: Engine, child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the sweeper between step 1 (``expiring``) and step 3 (``expired``).

    A window is one task's batch (about 300 unlinks on a tmpfs, a few ms): seen open, it may
    close before a kill lands. So the sweeper is stopped first, the window read again while
    nothing moves, and killed only if it is still open; otherwise it goes on to the next one.
    """
    deadline = time.monotonic() + 30
    while True:
        assert child.poll() is None, child.stderr.read() if child.stderr else b""
        assert time.monotonic() < deadline, "the sweep was never stopped inside a window"
        if _expiring(engine) == 0:
            time.sleep(0.001)
            continue
        os.kill(child.pid, signal.SIGSTOP)
        wait_all_threads_stopped(child.pid)
        if _expiring(engine) > 0:
            os.kill(child.pid, signal.SIGKILL)
            return
        os.kill(child.pid, signal.SIGCONT)


def _killed_then_rerun(engine: Engine, db_url: str, root: Path, procs: Processes) -> None:
    tasks = [f"t{i}" for i in range(10)]
    seed(engine, root, tasks=tasks, runs_per_task=1000, start_ms=now_ms() - 30 * DAY_MS)
    assert counts(engine) == {"present": 10_000, "runs": 10_000}

    child = subprocess.Popen(
        [sys.executable, "-c", _SWEEPER, db_url, str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    procs.track_pid(child.pid)
    try:
        _kill_while_expiring(engine, child)
    finally:
        if child.poll() is None:  # a failure left it running, or stopped: end it now
            os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        if child.stderr:
            child.stderr.close()
    left = _expiring(engine)
    assert left > 0
    dangling, orphans = file_and_row_agree(engine, root)
    assert dangling == [] and orphans == []  # expiring rows may or may not have their file

    sweep = _sweep(engine, root, POLICY, GlobalBudgets(total_log_bytes=None, free_reserve_bytes=0))
    first = sweep.run_pass()
    assert first.finished_expiring == left  # finished before anything new is examined
    _until_quiet(sweep)

    final = counts(engine)
    assert "expiring" not in final
    assert final["present"] == 10 * POLICY.keep_runs
    assert final["runs"] == 10 * POLICY.keep_rows  # rows past the row budget went
    assert file_and_row_agree(engine, root) == ([], [])
    on_disk = sum(1 for shard in root.iterdir() for _ in shard.iterdir())
    assert on_disk == 10 * POLICY.keep_runs


def _pin(engine: Engine, run_id: str) -> None:
    RetentionRepository(engine).set_pinned(run_id, True)


def test_pinned_active_and_unconsumed_runs_survive_every_budget(
    engine: Engine, tmp_path: Path
) -> None:
    root = tmp_path / "logs"
    # Besides: with the harshest policy, the latest succeeded run still keeps its log.
    start = now_ms() - 30 * DAY_MS
    plain = seed(engine, root, tasks=["t"], runs_per_task=8, start_ms=start)
    unconsumed = seed(engine, root, tasks=["t"], runs_per_task=1, start_ms=start + 100,
                      journal="spawned")  # fmt: skip
    quarantined = seed(engine, root, tasks=["t"], runs_per_task=1, start_ms=start + 200,
                       journal="quarantined")  # fmt: skip
    _pin(engine, plain[0].run_id)
    with engine.begin() as conn:  # an active run: running, its attempt running
        conn.execute(update(runs).where(runs.c.id == plain[1].run_id).values(status="running"))
        conn.execute(
            update(attempts).where(attempts.c.id == plain[1].attempt_id).values(status="running")
        )
    harshest = RetentionPolicy(keep_runs=0, keep_days=0, keep_rows=1, task_log_bytes=0)
    _until_quiet(
        _sweep(engine, root, harshest, GlobalBudgets(total_log_bytes=0, free_reserve_bytes=2**60))
    )
    survivors = {plain[0], plain[1], unconsumed[0], quarantined[0]}
    with engine.connect() as conn:
        rows = {
            r.id: r.log_state for r in conn.execute(select(attempts.c.id, attempts.c.log_state))
        }
    for s in survivors:
        assert rows[s.attempt_id] is None, s
        assert (root / s.attempt_id[-2:] / f"{s.attempt_id}.log").exists()
    # Every other log went and, past the row budget of 1, its rows. (The latest succeeded
    # run, which keeps its log as the evidence floor, is the quarantined one here.)
    assert set(rows) == {s.attempt_id for s in survivors}
    assert file_and_row_agree(engine, root) == ([], [])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_free_space_below_the_reserve_expires_the_oldest_eligible_logs_first(
    engine: Engine, tmp_path: Path
) -> None:
    with mounted_tmpfs(tmp_path / "small", size_mib=60) as mount:
        root = mount / "logs"
        start = now_ms() - 30 * DAY_MS
        seeded = seed(engine, root, tasks=["a", "b"], runs_per_task=20, log_bytes=MIB,
                      start_ms=start)  # fmt: skip
        _pin(engine, seeded[0].run_id)  # the oldest of all: pinned, never goes
        reserve = free_bytes(mount) + 8 * MIB  # 8 MiB short of the reserve
        generous = RetentionPolicy(keep_runs=100, keep_days=0, keep_rows=200, task_log_bytes=None)
        report = _sweep(
            engine, root, generous, GlobalBudgets(total_log_bytes=None, free_reserve_bytes=reserve)
        ).run_pass()
        assert free_bytes(mount) >= reserve
        with engine.connect() as conn:
            gone = {
                r.id
                for r in conn.execute(
                    select(attempts.c.id).where(attempts.c.log_state == "expired")
                )
            }
        order = [s.attempt_id for s in seeded]
        # The oldest eligible went first: task a's runs 1..8 (run 0 is pinned), nothing else.
        assert report.expired_logs == 8
        assert gone == set(order[1:9])
        assert file_and_row_agree(engine, root) == ([], [])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_free_space_pressure_reaches_past_many_tasks_whose_oldest_logs_must_stay(
    engine: Engine, tmp_path: Path
) -> None:
    """Twenty idle cron tasks, each with one run (its evidence floor, never expired), hold the
    oldest logs; a chatty task's newer logs are kept only by keep_runs. Under free-space
    pressure the global step looks at 16 tasks a pass (edge: 4 x 4): it must resume past
    those it had to keep, not read the same oldest page every pass and free nothing."""
    root = tmp_path / "logs"
    start = now_ms() - 30 * DAY_MS
    seed(engine, root, tasks=[f"idle{i:02d}" for i in range(20)], runs_per_task=1, start_ms=start)
    chatty = seed(engine, root, tasks=["chatty"], runs_per_task=10, start_ms=start + 1000)
    generous = RetentionPolicy(keep_runs=100, keep_days=0, keep_rows=200, task_log_bytes=None)
    sweep = LogSweep(
        repo=RetentionRepository(engine), logs_root=root, policy=generous,
        budgets=GlobalBudgets(total_log_bytes=None, free_reserve_bytes=2**40),
        tasks_per_pass=4, files_per_pass=256, free_bytes=lambda _path: 0,
    )  # fmt: skip
    expired = sum(sweep.run_pass().expired_logs for _ in range(3))
    assert expired == 9  # every chatty log but its latest (the floor); no idle task's
    with engine.connect() as conn:
        gone = set(conn.execute(select(attempts.c.id).where(attempts.c.log_state == "expired")).scalars())
    assert gone == {s.attempt_id for s in chatty[:-1]}
    assert file_and_row_agree(engine, root) == ([], [])


def test_a_read_only_logs_file_system_puts_no_free_space_pressure(tmp_path: Path) -> None:
    """No unlink could free anything there: the sweep must not mark logs expiring (they
    would read 410 and stay on disk); the admission keeps runs waiting instead."""
    from app.worker.log_retention import free_bytes_of

    with mounted_tmpfs(tmp_path / "ro", size_mib=2) as mount:
        assert free_bytes_of(mount) == free_bytes(mount) > 0
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        assert free_bytes_of(mount) is None
