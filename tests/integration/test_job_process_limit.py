"""A job's process limit (``max_processes`` in the spec, QL_JOB_MAX_PROCESSES; docs/job-user.md
"Process limit"), against the real shim with real processes.

The job is a small Python program that tries to start 50 ``sleep`` children with a limit of
10, counts the forks refused and why, and exits 7 without waiting. Run as the job user
(``nobody``, tests/jobuser.py) the forks beyond the limit are refused with EAGAIN, by its
cgroup's ``pids.max`` where this host enables the pids controller for job cgroups, else by
RLIMIT_NPROC; the job still ends with its own exit status, and every child it did start is
killed as a leftover. Each way in runs: clone3 into the job's cgroup, the fallback that moves
the shim (``no_clone3``), no cgroup at all, and through the zygote. Every ``sleep`` carries a
marker in its argv: at the end none may be alive (any found is killed by exact identity and
the test fails).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.worker import cgroups
from app.worker.zygote import Zygote
from tests.integration.conftest import Launched
from tests.integration.kit import (
    make_spec,
    receipt_path,
    wait_shim_done,
    zlaunch,
)
from tests.integration.test_shim import launch
from tests.integration.test_shim_zygote import zygote
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir
from tests.kit.fork_bomb import EXIT, JOB, LIMIT, TRIES, job_counts, no_survivors, python_for_job

__all__ = ["zygote"]  # the fixture, shared with the zygote's own tests


@pytest.fixture
def marker() -> Iterator[str]:
    with no_survivors() as value:
        yield value


def _net(way: str) -> dict[str, Any]:
    if way == "tree":
        return {"cgroup_root": None}
    root = cgroups.detect(cgroups.AUTO)
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here: only the process-tree path runs")
    return {
        "cgroup_root": str(root.path),
        **({"test_hook": "no_clone3"} if way == "migrate" else {}),
    }


def _run(
    tmp_path: Path, launched: Launched, marker: str, start: Any, **over: Any
) -> tuple[dict[str, Any], dict[str, int]]:
    """Run the job to its receipt; (receipt, the job's own counts)."""
    with reachable_dir() as work:
        spec = make_spec(
            tmp_path, [python_for_job(), "-I", "-S", "-c", JOB, marker], cwd=str(work), **over
        )
        status = start(spec)
        assert status["ok"] is True, status
        if status["cgroup"] is not None:
            launched.track_cgroup(status["cgroup"])
        wait_shim_done(status)
    receipt = json.loads(receipt_path(spec).read_bytes())
    out = Path(spec["log_path"]).read_text()
    if status["cgroup"] is not None:
        assert not (Path(spec["cgroup_root"]) / status["cgroup"]).exists()
    return receipt, job_counts(out)


_JOB_USER = {"uid": JOB_UID, "gid": JOB_UID, "umask": 0o077, "home": None, "home_root": "/tmp"}


@pytest.mark.parametrize("way", ["clone3", "migrate", "tree", "zygote"])
def test_a_job_user_job_past_its_limit_sees_forks_refused_and_ends_with_its_own_status(
    tmp_path: Path, launched: Launched, marker: str, zygote: Zygote, way: str
) -> None:
    job_user_or_skip()
    start = (
        (lambda spec: zlaunch(zygote, spec, launched))
        if way == "zygote"
        else (lambda spec: launch(spec, launched))
    )
    net = _net("clone3" if way == "zygote" else way)
    receipt, counts = _run(
        tmp_path, launched, marker, start, job=_JOB_USER, max_processes=LIMIT, **net
    )
    assert receipt["exitCode"] == EXIT and "signal" not in receipt
    # The job itself is one of the LIMIT (and, by RLIMIT_NPROC, so is any other process of
    # the job user on this host): at most LIMIT - 1 children, the rest refused with EAGAIN.
    assert counts["started"] + counts["refused"] == TRIES, counts
    assert counts["started"] <= LIMIT - 1 and counts["refused"] >= TRIES - LIMIT + 1, counts
    assert counts["other"] == 0, counts
    assert receipt["leftoversStopped"] == counts["started"]  # every child it did start: killed


def test_without_a_limit_the_same_job_starts_every_child(
    tmp_path: Path, launched: Launched, marker: str
) -> None:
    """The control: the refusals above come from the limit, not from the host."""
    job_user_or_skip()
    receipt, counts = _run(
        tmp_path, launched, marker, lambda spec: launch(spec, launched), job=_JOB_USER,
        cgroup_root=None,
    )  # fmt: skip
    assert receipt["exitCode"] == EXIT
    assert counts == {"started": TRIES, "refused": 0, "other": 0}
    assert receipt["leftoversStopped"] == TRIES


@pytest.mark.parametrize("way", ["clone3", "tree"])
def test_a_job_of_the_shims_own_user_is_limited_only_by_its_cgroups_pids_max(
    tmp_path: Path, launched: Launched, marker: str, way: str
) -> None:
    """RLIMIT_NPROC is never set for the service's own user (it would count the service's
    processes too): without pids.max for its cgroup such a job has no limit, as the worker's
    start line warns (app/worker/process_limit.py)."""
    net = _net(way)
    root = None if net["cgroup_root"] is None else cgroups.CgroupRoot(Path(net["cgroup_root"]))
    held = cgroups.pids_problem(root) is None
    receipt, counts = _run(
        tmp_path, launched, marker, lambda spec: launch(spec, launched), max_processes=LIMIT,
        **net,
    )  # fmt: skip
    assert receipt["exitCode"] == EXIT
    if held:
        assert counts["started"] <= LIMIT - 1 and counts["other"] == 0, counts
    else:
        assert counts == {"started": TRIES, "refused": 0, "other": 0}
    assert receipt["leftoversStopped"] == counts["started"]
