"""The launcher runs jobs as the job user: real shims (zygote and one-shot), real processes.

Root-only (``nobody`` as the job user, tests/jobuser.py). The job's identity, groups, umask
and HOME are the job user's; the shim stays the service's user; a job of another uid is still
stopped by exact identity (and its cgroup with it where the host has one, the job born in it
by clone3 or, with the shim's ``no_clone3`` test hook, by the fallback that moves the shim in
and out); a ``run_as`` the worker was not configured for is refused before anything is
journaled or spawned.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.errors import LaunchFailed
from app.storage.journal_repo import JournalRepository
from app.worker.cgroups import AUTO, detect
from app.worker.identity import wait_exit
from app.worker.job_user import JobPolicy, resolve
from app.worker.launcher import IdentityController, ShimLauncher
from app.worker.receipts import ReceiptStore
from tests.jobuser import JOB_UID, job_user_or_skip
from tests.worker.kit import Processes, armed_run, launch_request, make_log, wait_for

DEADLINE = 20.0
SCRIPT = (
    'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G) umask=$(umask) home=$HOME '
    'mode=$(stat -c %u:%a "$HOME") shim=$(stat -c %u /proc/$PPID)"; '
    'kill -0 "$PPID" 2>/dev/null && echo shim-signal-open; echo ready; exec sleep 60'
)


def _policy(default: bool) -> JobPolicy:
    user = resolve(job_user_or_skip())
    return JobPolicy(
        default=user if default else None, allowed={"batch": user}, umask=0o027, home=None,
        home_root=Path("/tmp"),
    )  # fmt: skip


@pytest.fixture(params=["zygote", "exec"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("start", ["clone3", "migrate"])
@pytest.mark.parametrize("via", ["default", "run_as"])
def test_a_job_runs_as_the_job_user_and_is_still_stopped_by_identity(
    engine: Engine, tmp_path: Path, procs: Processes, mode: str, via: str, start: str
) -> None:
    root = detect(AUTO)
    launcher = ShimLauncher(
        journal=JournalRepository(engine), receipts=ReceiptStore(tmp_path / "receipts"),
        mode=mode, cgroup_root=root, job_policy=_policy(default=via == "default"),
        spec_extra={"test_hook": "no_clone3"} if start == "migrate" else None,
    )  # fmt: skip
    try:
        armed = armed_run(engine)
        log = make_log(tmp_path / "logs", armed.attempt_id)
        request = launch_request(armed, argv=["/bin/sh", "-c", SCRIPT], log_path=log)
        if via == "run_as":
            request = type(request)(**{**request.__dict__, "run_as": "batch"})
        handle = procs.track(launcher.launch(request))
        wait_for(lambda: b"ready" in log.read_bytes(), "the job's first lines", DEADLINE)
        out = log.read_text()
        assert f"uid={JOB_UID} gid={JOB_UID} groups={JOB_UID} umask=0027" in out, out
        assert "shim-signal-open" not in out, out
        home = out.split("home=", 1)[1].split()[0]
        assert f"mode={JOB_UID}:700" in out and home.startswith("/tmp/ql-home-"), out
        assert f"shim={os.geteuid()}" in out, out  # non-dumpable: its /proc is root's anyway
        assert os.stat(f"/proc/{handle.pid}").st_uid == JOB_UID
        cgroup = None if root is None else root.job_dir(handle.cgroup)
        if cgroup is not None:  # the job keeps its own cgroup under another uid
            members = (cgroup / "cgroup.procs").read_text().split()
            assert str(handle.pid) in members and str(handle.shim_pid) not in members
        controller = IdentityController(cgroup_root=root)
        assert controller.stop(handle, grace_seconds=5.0) == "stopped"
        assert wait_exit(handle.shim_pid, DEADLINE)
        deadline = time.monotonic() + DEADLINE
        while Path(home).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not Path(home).exists(), "the per-job HOME outlived its job"
        if cgroup is not None:
            assert not cgroup.exists()
    finally:
        launcher.close()


@pytest.mark.parametrize("configured", [True, False], ids=["other-user", "no-job-user"])
def test_a_run_as_the_worker_does_not_allow_is_refused_before_the_journal(
    engine: Engine, tmp_path: Path, mode: str, configured: bool
) -> None:
    journal = JournalRepository(engine)
    launcher = ShimLauncher(
        journal=journal, receipts=ReceiptStore(tmp_path / "receipts"), mode=mode,
        job_policy=_policy(default=True) if configured else None,
    )  # fmt: skip
    try:
        armed = armed_run(engine)
        log = make_log(tmp_path / "logs", armed.attempt_id)
        request = launch_request(armed, argv=["/bin/true"], log_path=log)
        request = type(request)(**{**request.__dict__, "run_as": "root"})
        with pytest.raises(LaunchFailed) as info:
            launcher.launch(request)
        assert info.value.reason == "RUN_AS_NOT_ALLOWED"
        assert journal.get(armed.attempt_id) is None
    finally:
        launcher.close()
