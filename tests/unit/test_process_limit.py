"""QL_JOB_MAX_PROCESSES: the setting, whether job cgroups have pids.max (a fake cgroup dir),
the worker's start line for each case, and the shim's choice between pids.max and
RLIMIT_NPROC (docs/job-user.md "Process limit"). The real processes:
tests/integration/test_job_process_limit.py."""

from __future__ import annotations

import logging
import typing
from pathlib import Path

import pytest

from app.api.schemas import HeldBy
from app.context.execution_wiring import process_limit_of
from app.settings import DEFAULT_JOB_MAX_PROCESSES, Settings
from app.worker import shim
from app.worker.cgroups import CgroupRoot, pids_problem
from app.worker.job_user import JobPolicy, JobUser
from app.worker.process_limit import HELD_BY, describe, held_by


def test_the_limit_is_on_by_default_and_off_only_when_said() -> None:
    assert Settings.from_env({}).job_max_processes == DEFAULT_JOB_MAX_PROCESSES == 4096
    assert Settings.from_env({"QL_JOB_MAX_PROCESSES": " 64 "}).job_max_processes == 64
    assert Settings.from_env({"QL_JOB_MAX_PROCESSES": "OFF"}).job_max_processes is None


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("many", "must be a whole number or off, not 'many'"),
        ("1", "must be between 2 and 4194304, or off, not 1"),
        ("4194305", "must be between 2 and 4194304"),
        ("-5", "must be between"),
    ],
)
def test_a_bad_limit_is_refused_with_its_name(raw: str, words: str) -> None:
    with pytest.raises(ValueError, match="QL_JOB_MAX_PROCESSES " + words):
        Settings.from_env({"QL_JOB_MAX_PROCESSES": raw})


def _root(tmp_path: Path, controllers: str | None, subtree: str | None) -> CgroupRoot:
    """A fake cgroup v2 root: only the two files the detection reads."""
    if controllers is not None:
        (tmp_path / "cgroup.controllers").write_text(controllers + "\n")
    if subtree is not None:
        (tmp_path / "cgroup.subtree_control").write_text(subtree + "\n")
    return CgroupRoot(tmp_path)


def test_job_cgroups_have_pids_max_only_when_the_root_enables_pids_for_them(
    tmp_path: Path,
) -> None:
    assert pids_problem(None) == "no job cgroups"
    assert pids_problem(_root(tmp_path, "cpu io memory pids", "memory pids")) is None


def test_a_pids_controller_available_but_not_enabled_is_named_so(tmp_path: Path) -> None:
    problem = pids_problem(_root(tmp_path, "cpu memory pids", "memory"))
    assert problem == f"pids not enabled in {tmp_path}/cgroup.subtree_control"


def test_no_pids_controller_at_all_is_named_so(tmp_path: Path) -> None:
    # A hybrid host (this one): pids is bound to a cgroup v1 hierarchy, v2 offers hugetlb.
    problem = pids_problem(_root(tmp_path, "hugetlb", ""))
    assert problem == f"no pids controller in {tmp_path}/cgroup.controllers"


def test_an_unreadable_root_is_no_pids_max(tmp_path: Path) -> None:
    problem = pids_problem(_root(tmp_path, "pids", None))
    assert problem is not None and problem.startswith("cannot read ")


_USER = JobUser("nobody", 65534, 65534)


def _policy(default: bool) -> JobPolicy:
    return JobPolicy(
        default=_USER if default else None, allowed={"batch": _USER}, umask=0o077, home=None,
        home_root=Path("/tmp"),
    )  # fmt: skip


def test_the_start_line_says_how_the_limit_holds_or_that_it_does_not() -> None:
    level, line = describe(None, None, None)
    assert level == logging.INFO and "QL_JOB_MAX_PROCESSES=off" in line

    level, line = describe(10, None, _policy(default=True))
    assert level == logging.INFO
    assert "process limit 10 per job by the pids.max of its cgroup" in line
    assert "RLIMIT_NPROC" in line  # a job without a cgroup (leftovers keep)
    level, line = describe(10, None, None)
    assert level == logging.INFO and "(leftovers keep) has none" in line

    level, line = describe(10, "no pids controller in /cg/cgroup.controllers", _policy(True))
    assert level == logging.INFO
    assert line.startswith("process limit 10 per job user by RLIMIT_NPROC")
    assert "across its running jobs" in line and "/cg/cgroup.controllers" in line

    level, line = describe(10, "no job cgroups", _policy(default=False))
    assert level == logging.WARNING and "only run_as jobs run as a job user" in line

    level, line = describe(10, "no job cgroups", None)
    assert level == logging.WARNING
    assert line.startswith("QL_JOB_MAX_PROCESSES=10 is not enforced")
    assert "without bound" in line


def test_ping_and_readyz_name_the_same_case_as_the_start_line() -> None:
    cases = [
        ((None, None, None), "off"),
        ((10, None, _policy(default=True)), "pids_max"),
        ((10, None, None), "pids_max"),
        ((10, "no job cgroups", _policy(default=True)), "rlimit_nproc"),
        ((10, "no job cgroups", _policy(default=False)), "rlimit_nproc_run_as"),
        ((10, "no job cgroups", None), "none"),
    ]
    assert {held_by(*case) for case, _ in cases} == set(HELD_BY) == set(typing.get_args(HeldBy))
    for case, word in cases:
        assert held_by(*case) == word
        said = {"max_processes": case[0], "held_by": word}
        assert process_limit_of({"ok": True, "process_limit": said}) == said
    # A worker of a build before it says nothing; a shape this build cannot read is none.
    for answer in ({"ok": True}, {"process_limit": {"max_processes": 0, "held_by": "none"}},
                   {"process_limit": {"max_processes": 10, "held_by": "cgroup"}},
                   {"process_limit": "pids_max"}):  # fmt: skip
        assert process_limit_of(answer) is None


def test_the_shim_writes_pids_max_where_the_job_cgroup_has_one(tmp_path: Path) -> None:
    job = tmp_path / "ql-job"
    job.mkdir()
    assert shim._limit_pids(str(job), 10) is False  # no pids.max: no pids controller
    (job / "pids.max").write_text("max\n")
    assert shim._limit_pids(str(job), None) is False
    assert (job / "pids.max").read_text() == "max\n"
    assert shim._limit_pids(str(job), 10) is True
    assert (job / "pids.max").read_text().startswith("10")


def test_the_shim_sets_rlimit_nproc_only_for_a_job_user_without_pids_max() -> None:
    job = {"uid": 65534, "gid": 65534, "umask": 0o77, "home": None, "home_root": "/tmp"}
    assert shim._nproc({"job": job, "max_processes": 10}, pids_held=False) == 10
    assert shim._nproc({"job": job, "max_processes": 10}, pids_held=True) is None
    assert shim._nproc({"max_processes": 10}, pids_held=False) is None  # the shim's own user
    assert shim._nproc({"job": job}, pids_held=False) is None  # no limit asked
