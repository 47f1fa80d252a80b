"""The per-job HOME (``QL_JOB_USER``) goes with the job, whatever the job did to it, and its
removal never holds up the job's ending.

Real shims and real jobs as ``nobody`` (docs/job-user.md). A job can nest directories
deeper than Python's recursion limit; another job of the same user can SIGSTOP the remover:
neither may leave the HOME behind (the first) or keep the shim from exiting for more than
the second it waits for the remover, which is when the worker records the ending (security
walk-through, review).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from app.worker.identity import read_identity
from tests.integration.conftest import Launched
from tests.integration.kit import make_spec, poll_until, receipt_path, wait_shim_done
from tests.integration.test_shim import launch
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir

DEPTH = 1500  # past the recursion limit (1000) the old recursive removal died at


def _homes(root: Path) -> Path:
    homes = root / "homes"
    homes.mkdir(mode=0o700)
    os.chown(homes, JOB_UID, JOB_UID)
    return homes


def _job(homes: Path) -> dict[str, object]:
    return {"uid": JOB_UID, "gid": JOB_UID, "umask": 0o077, "home": None,
            "home_root": str(homes)}  # fmt: skip


def test_a_home_nested_deeper_than_the_recursion_limit_is_removed(
    tmp_path: Path, launched: Launched
) -> None:
    job_user_or_skip()
    with reachable_dir() as root:
        homes = _homes(root)
        script = (
            f'cd "$HOME" && i=0 && while [ $i -lt {DEPTH} ]; do mkdir d && cd d || exit 3; '
            "i=$((i+1)); done; : > leaf"
        )
        spec = make_spec(tmp_path, ["/bin/sh", "-c", script], cwd="/", job=_job(homes))
        status = launch(spec, launched)
        assert status["ok"] is True, status
        wait_shim_done(status)
        assert Path(spec["log_path"]).read_bytes() == b""  # the job made every level
        poll_until(lambda: list(homes.iterdir()) == [])  # the remover is not waited for


def test_a_stopped_remover_does_not_hold_up_the_shims_exit(
    tmp_path: Path, launched: Launched
) -> None:
    job_user_or_skip()
    with reachable_dir() as root:
        homes = _homes(root)
        spec = make_spec(
            tmp_path, ["/bin/sh", "-c", "exit 4"], cwd="/", job=_job(homes),
            test_hook="stall_home_removal",
        )  # fmt: skip
        status = launch(spec, launched)
        assert status["ok"] is True, status
        poll_until(lambda: any(homes.glob("*.remover-pid")))
        said = next(homes.glob("*.remover-pid"))
        poll_until(lambda: said.read_text() != "")
        remover = int(said.read_text())
        try:
            wait_shim_done(status)  # the shim exited although its remover is stopped
            assert receipt_path(spec).exists()
            ident = read_identity(remover)
            assert ident is not None  # still there, stopped: the shim did not wait for it
        finally:
            os.kill(remover, signal.SIGKILL)  # by its pid; init or a subreaper reaps it
        poll_until(lambda: read_identity(remover) is None)
        shutil.rmtree(homes)  # what the stopped remover left
