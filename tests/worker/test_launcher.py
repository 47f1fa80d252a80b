"""The launcher with the real shim, real processes and a real journal (SQLite, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from app.domain.errors import LaunchFailed, LaunchRejected
from app.domain.execution import LaunchRequest
from app.domain.model import ProcessHandle
from app.storage.engine import make_engine
from app.storage.journal_repo import RESERVED, SPAWN_FAILED, SPAWNED, JournalRepository
from app.worker.cgroups import AUTO, PREFIX, CgroupRoot, detect
from app.worker.identity import current_boot_id, read_identity, wait_exit
from app.worker.launcher import IdentityController, ShimLauncher
from app.worker.receipts import ReceiptStore
from tests.worker.kit import (
    Armed,
    Processes,
    armed_run,
    concurrently,
    launch_request,
    make_log,
    wait_for,
)

DEADLINE = 20.0
_BEDS: list[Bed] = []
_MODE: list[str] = ["zygote"]


@pytest.fixture(autouse=True, params=["zygote", "exec"])
def shim_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every launcher test runs with the zygote and with one-shot shims (QL_SHIM_MODE)."""
    _MODE[0] = request.param
    try:
        yield request.param
    finally:
        while _BEDS:
            _BEDS.pop().launcher.close()
GATED = "echo started >> {spawns}; while [ ! -e {gate} ]; do sleep 0.01; done; exit 0"


class Bed:
    def __init__(self, engine: Engine, root: Path, **launcher_kw: Any) -> None:
        self.engine = engine
        self.root = root
        self.journal = JournalRepository(engine)
        self.store = ReceiptStore(root / "receipts")
        launcher_kw.setdefault("mode", _MODE[0])
        self.launcher = ShimLauncher(journal=self.journal, receipts=self.store, **launcher_kw)
        _BEDS.append(self)
        self.spawns = root / "spawns"
        self.gate = root / "gate"

    def gated_request(self, armed: Armed | None = None) -> tuple[Armed, LaunchRequest]:
        armed = armed or armed_run(self.engine)
        log = make_log(self.root / "logs", armed.attempt_id)
        script = GATED.format(spawns=self.spawns, gate=self.gate)
        return armed, launch_request(armed, argv=["/bin/sh", "-c", script], log_path=log)

    def spawn_count(self) -> int:
        return len(self.spawns.read_text().splitlines()) if self.spawns.exists() else 0

    def finish(self, handle: ProcessHandle) -> None:
        self.gate.touch()
        assert wait_exit(handle.shim_pid, DEADLINE), "the shim did not finish"


def test_journal_is_committed_before_the_shim_is_spawned(
    engine: Engine, db_url: str, tmp_path: Path, procs: Processes
) -> None:
    seen: list[str | None] = []
    other = make_engine(db_url)  # a separate connection only sees committed rows

    def observe(request: LaunchRequest) -> None:
        entry = JournalRepository(other).get(request.attempt_id)
        seen.append(None if entry is None else entry.state)
        assert ReceiptStore(tmp_path / "receipts").path_of(request.attempt_id).parent.is_dir()

    try:
        bed = Bed(engine, tmp_path, before_spawn=observe)
        armed, request = bed.gated_request()
        handle = procs.track(bed.launcher.launch(request))
        assert seen == [RESERVED]
        entry = JournalRepository(other).get(armed.attempt_id)
        assert entry is not None and entry.state == SPAWNED and entry.handle == handle
        assert handle.pgid == handle.pid and read_identity(handle.pid) is not None
        wait_for(lambda: bed.spawn_count() == 1, "the job to start", DEADLINE)
        bed.finish(handle)
        assert bed.store.path_of(armed.attempt_id).exists()  # the shim published
    finally:
        other.dispose()


def test_repeated_launch_returns_the_first_handle_and_never_spawns_twice(
    engine: Engine, tmp_path: Path, procs: Processes
) -> None:
    bed = Bed(engine, tmp_path)
    _armed, request = bed.gated_request()
    first = procs.track(bed.launcher.launch(request))
    again = bed.launcher.launch(request)
    assert again == first
    wait_for(lambda: bed.spawn_count() == 1, "the job to start", DEADLINE)
    bed.finish(first)
    assert bed.spawn_count() == 1


def test_launch_of_an_attempt_reserved_elsewhere_is_rejected(
    engine: Engine, tmp_path: Path
) -> None:
    bed = Bed(engine, tmp_path)
    armed, request = bed.gated_request()
    bed.journal.reserve(attempt_id=armed.attempt_id, run_id=armed.run_id, receipt_ref="r")
    with pytest.raises(LaunchRejected) as info:
        bed.launcher.launch(request)
    assert info.value.reason == "LAUNCH_IN_FLIGHT"
    assert bed.spawn_count() == 0


def test_two_concurrent_launches_spawn_one_process(
    engine: Engine, tmp_path: Path, procs: Processes
) -> None:
    bed = Bed(engine, tmp_path)
    _armed, request = bed.gated_request()
    results = concurrently(2, lambda: bed.launcher.launch(request), timeout=DEADLINE)
    handles = [r for r in results if isinstance(r, ProcessHandle)]
    for h in handles:
        procs.track(h)
    assert len(results) == 2 and handles and len(set(handles)) == 1
    assert all(isinstance(r, ProcessHandle | LaunchRejected) for r in results)
    wait_for(lambda: bed.spawn_count() == 1, "the job to start", DEADLINE)
    bed.finish(handles[0])
    assert bed.spawn_count() == 1


def test_exec_failure_is_journaled_and_never_retried(engine: Engine, tmp_path: Path) -> None:
    bed = Bed(engine, tmp_path)
    armed = armed_run(engine)
    log = make_log(tmp_path / "logs", armed.attempt_id)
    request = launch_request(armed, argv=["/nonexistent/program"], log_path=log)
    with pytest.raises(LaunchFailed) as info:
        bed.launcher.launch(request)
    assert info.value.reason == "EXEC_FAILED" and not isinstance(info.value, LaunchRejected)
    assert info.value.errno_name == "ENOENT"  # the program is not there (never its path)
    entry = bed.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == SPAWN_FAILED
    with pytest.raises(LaunchRejected) as again:
        bed.launcher.launch(request)
    assert again.value.reason == "ALREADY_LAUNCHED"


def test_a_shim_that_never_reports_leaves_nothing_running(
    engine: Engine, tmp_path: Path, procs: Processes
) -> None:
    pid_file = tmp_path / "child.pid"
    fake = tmp_path / "silent_shim.py"
    # Starts a long-lived process in its session (as a real shim starts a job), then hangs
    # without ever writing a status line.
    fake.write_text(
        "import os, sys, time\n"
        "if '--zygote' in sys.argv:\n"  # as a zygote it cannot start: one-shot fallback
        "    sys.exit(1)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(120)\n"
        "    os._exit(0)\n"
        f"open({str(pid_file)!r}, 'w').write(str(pid))\n"
        "time.sleep(120)\n"
    )
    # Long enough for the fake's own start-up and fork on a loaded host.
    bed = Bed(engine, tmp_path, shim_path=str(fake), status_timeout_s=3.0)
    armed = armed_run(engine)
    log = make_log(tmp_path / "logs", armed.attempt_id)
    request = launch_request(armed, argv=["/bin/true"], log_path=log)
    with pytest.raises(LaunchFailed) as info:
        bed.launcher.launch(request)
    assert info.value.reason == "SHIM_NO_STATUS"
    child = int(pid_file.read_text())
    procs.track_pid(child)
    assert wait_exit(child, DEADLINE), "the shim's session was not killed"
    entry = bed.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == SPAWN_FAILED


def test_stop_by_identity_stops_once(engine: Engine, tmp_path: Path, procs: Processes) -> None:
    bed = Bed(engine, tmp_path)
    _armed, request = bed.gated_request()
    handle = procs.track(bed.launcher.launch(request))
    controller = IdentityController()
    assert controller.stop(handle, grace_seconds=5.0) == "stopped"
    assert controller.stop(handle, grace_seconds=5.0) == "already_exited"
    assert wait_exit(handle.shim_pid, DEADLINE)


def test_the_shim_adopts_the_jobs_orphans_and_reports_this_boot(
    engine: Engine, tmp_path: Path, procs: Processes
) -> None:
    # The job exits at once; its background child outlives it and writes down its parent.
    orphan = '(sleep 0.2; read -r _ _ _ ppid _ < /proc/self/stat; echo "ppid=$ppid") & exit 0'
    bed = Bed(engine, tmp_path)
    armed = armed_run(engine)
    log = make_log(tmp_path / "logs", armed.attempt_id)
    request = launch_request(armed, argv=["/bin/sh", "-c", orphan], log_path=log, leftovers="keep")
    handle = procs.track(bed.launcher.launch(request))
    assert handle.boot_id == current_boot_id()
    assert wait_exit(handle.shim_pid, DEADLINE)
    assert log.read_text() == f"ppid={handle.shim_pid}\n"  # a subreaper, not init


# ---- the job's own cgroup (docs/leftovers.md) --------------------------------------------


def _cgroup_root() -> CgroupRoot:
    root = detect(AUTO)
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here (QL_CGROUP_ROOT auto found none)")
    return root


def test_a_job_runs_in_its_own_cgroup_and_the_stop_removes_it(
    engine: Engine, tmp_path: Path, procs: Processes
) -> None:
    root = _cgroup_root()
    bed = Bed(engine, tmp_path, cgroup_root=root)
    armed, request = bed.gated_request()
    handle = procs.track(bed.launcher.launch(request))
    assert handle.cgroup == f"{PREFIX}{armed.attempt_id}"
    path = root.job_dir(handle.cgroup)
    assert path is not None
    assert str(handle.pid) in (path / "cgroup.procs").read_text().split()
    assert str(handle.shim_pid) not in (path / "cgroup.procs").read_text().split()
    assert bed.journal.get(armed.attempt_id).handle == handle  # type: ignore[union-attr]
    controller = IdentityController(cgroup_root=root)
    assert controller.stop(handle, grace_seconds=5.0) == "stopped"
    assert wait_exit(handle.shim_pid, DEADLINE)
    assert not path.exists()


def test_a_failed_launch_leaves_no_cgroup(engine: Engine, tmp_path: Path) -> None:
    root = _cgroup_root()
    bed = Bed(engine, tmp_path, cgroup_root=root)
    armed = armed_run(engine)
    log = make_log(tmp_path / "logs", armed.attempt_id)
    request = launch_request(armed, argv=["/nonexistent/program"], log_path=log)
    with pytest.raises(LaunchFailed):
        bed.launcher.launch(request)
    assert not (root.path / f"{PREFIX}{armed.attempt_id}").exists()


def test_a_shim_lost_after_making_the_cgroup_leaves_none(
    engine: Engine, tmp_path: Path, procs: Processes
) -> None:
    root = _cgroup_root()
    fake = tmp_path / "lost_shim.py"
    # Does what a shim does first (its job's cgroup), then never reports.
    fake.write_text(
        "import json, os, sys, time\n"
        "if '--zygote' in sys.argv:\n"
        "    sys.exit(1)\n"
        "spec = json.loads(sys.stdin.read())\n"
        "os.mkdir(spec['cgroup_root'] + '/ql-' + spec['attempt_id'])\n"
        "time.sleep(120)\n"
    )
    # Long enough for the fake to make its cgroup on a loaded host (else the check is vacuous).
    bed = Bed(engine, tmp_path, shim_path=str(fake), status_timeout_s=3.0, cgroup_root=root)
    armed = armed_run(engine)
    log = make_log(tmp_path / "logs", armed.attempt_id)
    request = launch_request(armed, argv=["/bin/true"], log_path=log)
    with pytest.raises(LaunchFailed) as info:
        bed.launcher.launch(request)
    assert info.value.reason == "SHIM_NO_STATUS"
    assert not (root.path / f"{PREFIX}{armed.attempt_id}").exists()
