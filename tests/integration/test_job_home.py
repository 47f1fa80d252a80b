"""The per-job HOME (``QL_JOB_USER``) goes with the job, whatever the job did to it.

Real shims and real jobs as ``nobody`` (docs/job-user.md). A job can nest directories
deeper than Python's recursion limit; another job of the same user can SIGSTOP the remover:
neither may leave the HOME behind or the shim waiting for ever (security walk-through).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from app.worker import shim
from tests.integration.conftest import Launched
from tests.integration.kit import make_spec, wait_shim_done
from tests.integration.test_shim import launch
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir

DEPTH = 1500  # past the recursion limit (1000) the old recursive removal died at


def test_a_home_nested_deeper_than_the_recursion_limit_is_removed(
    tmp_path: Path, launched: Launched
) -> None:
    job_user_or_skip()
    with reachable_dir() as root:
        homes = root / "homes"
        homes.mkdir(mode=0o700)
        os.chown(homes, JOB_UID, JOB_UID)
        script = (
            f'cd "$HOME" && i=0 && while [ $i -lt {DEPTH} ]; do mkdir d && cd d || exit 3; '
            "i=$((i+1)); done; : > leaf"
        )
        job = {"uid": JOB_UID, "gid": JOB_UID, "umask": 0o077, "home": None,
               "home_root": str(homes)}  # fmt: skip
        spec = make_spec(tmp_path, ["/bin/sh", "-c", script], cwd="/", job=job)
        status = launch(spec, launched)
        assert status["ok"] is True, status
        wait_shim_done(status)
        assert Path(spec["log_path"]).read_bytes() == b""  # the job made every level
        assert list(homes.iterdir()) == [], "the deep HOME was left behind"


def test_a_stopped_remover_is_killed_after_its_bound_and_the_shim_goes_on() -> None:
    """What a SIGSTOP from another job of the same user does to the remover."""
    pid = os.fork()
    if pid == 0:  # the stand-in remover: stopped for ever
        try:
            os.kill(os.getpid(), signal.SIGSTOP)
        finally:
            os._exit(0)
    try:
        began = time.monotonic()
        shim._reap_within(pid, 0.3)
        took = time.monotonic() - began
        reaped = _reaped(pid)
    finally:
        if not _reaped(pid):  # whatever failed above, no stopped process outlives the test
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert reaped, "the stopped child was not killed and reaped"
    assert 0.3 <= took < 10, took


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_remover_that_ends_at_once_is_not_waited_for_the_bound() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    began = time.monotonic()
    try:
        shim._reap_within(pid, 30.0)
    finally:
        if not _reaped(pid):
            os.waitpid(pid, 0)
    assert time.monotonic() - began < 10  # at its exit, not after 30 s
