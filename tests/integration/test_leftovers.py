"""What is left of a job when its main process ends (docs/leftovers.md), against the real shim.

Each test runs three times: with the job in its own cgroup v2, started there by clone3
(``cgroup``) or by the fallback that moves the shim in and out (``cgroup-migrate``, the spec's
``no_clone3`` test hook), both skipped, with the reason, where this host has no writable cgroup
v2 hierarchy; and with the process tree as the only net (``tree``: the spec names no cgroup
root, as with ``QL_CGROUP_ROOT=off``). Jobs print the
identity (pid, start ticks) of each background child before exiting, so "gone" is checked
against that exact process, never a reused pid. Every cgroup a test causes is checked removed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.worker import cgroups
from app.worker.identity import read_identity
from tests.integration.conftest import Launched
from tests.integration.kit import make_spec, receipt_path, wait_shim_done
from tests.integration.test_shim import launch
from tests.worker.kit import kill_exact

# `$!` and its start ticks (field 22 of /proc/<pid>/stat; the comm of sh/sleep has no spaces).
_IDENT = 'echo $! $(cut -d" " -f22 /proc/$!/stat)'


@pytest.fixture(params=["cgroup", "cgroup-migrate", "tree"])
def net(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The spec keys that choose how the job is found: its cgroup root (and how it gets in)."""
    if request.param == "tree":
        return {"cgroup_root": None}
    root = cgroups.detect(cgroups.AUTO)
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here: only the process-tree path runs")
    hook = {"test_hook": "no_clone3"} if request.param == "cgroup-migrate" else {}
    return {"cgroup_root": str(root.path), **hook}


def _run(
    tmp_path: Path, script: str, launched: Launched, net: dict[str, Any], **over: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[tuple[int, int]]]:
    """Run ``script`` to its receipt; (spec, status, receipt JSON, printed identities)."""
    spec = make_spec(tmp_path, ["/bin/sh", "-c", script], **{**net, **over})
    status = launch(spec, launched)
    assert status["ok"] is True, status
    if status["cgroup"] is not None:
        launched.track_cgroup(status["cgroup"])  # only if the test fails: ended and removed
    wait_shim_done(status)
    idents = [
        (int(pid), int(ticks))
        for pid, ticks in (
            line.split() for line in Path(spec["log_path"]).read_text().splitlines() if line
        )
    ]
    receipt = json.loads(receipt_path(spec).read_bytes())
    return spec, status, receipt, idents


def _alive(pid: int, ticks: int) -> bool:
    ident = read_identity(pid)
    return ident is not None and ident.start_ticks == ticks


def _assert_cgroup_gone(spec: dict[str, Any], status: dict[str, Any]) -> None:
    root, name = spec["cgroup_root"], f"{cgroups.PREFIX}{spec['attempt_id']}"
    assert status["cgroup"] == (None if root is None else name)
    if root is not None:
        assert not (Path(root) / name).exists(), "the job's cgroup was left behind"


def test_background_and_setsid_children_die_with_the_main_process(
    tmp_path: Path, launched: Launched, net: dict[str, Any]
) -> None:
    script = f"sleep 301 & {_IDENT}; setsid sleep 302 & {_IDENT}; exit 0"
    spec, status, receipt, idents = _run(tmp_path, script, launched, net)
    for pid, _ticks in idents:
        launched.track_pid(pid)  # only if the test fails: cleanup by exact identity
    assert receipt["exitCode"] == 0
    assert receipt["leftoversStopped"] == 2
    assert len(idents) == 2 and not any(_alive(*ident) for ident in idents)
    _assert_cgroup_gone(spec, status)


def test_a_grandchild_in_its_own_session_is_reached_through_the_tree(
    tmp_path: Path, launched: Launched, net: dict[str, Any]
) -> None:
    # The middle shell lives on with its own child: both are found (the middle one is
    # adopted by the shim, its child is re-parented once the middle one dies).
    inner = f"setsid sleep 303 & {_IDENT}; wait"
    script = f"sh -c '{inner}' & {_IDENT}; sleep 0.2; exit 5"
    spec, status, receipt, idents = _run(tmp_path, script, launched, net)
    for pid, _ticks in idents:
        launched.track_pid(pid)
    assert receipt["exitCode"] == 5
    assert receipt["leftoversStopped"] == 2
    assert len(idents) == 2 and not any(_alive(*ident) for ident in idents)
    _assert_cgroup_gone(spec, status)


def test_a_child_that_left_the_jobs_cgroup_is_still_stopped(
    tmp_path: Path, launched: Launched
) -> None:
    # Same uid, writable root: a job can move itself out of its cgroup. The process tree is
    # the second net behind the cgroup.
    root = cgroups.detect(cgroups.AUTO)
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    escape = f"echo $$ > {root.path}/cgroup.procs; exec sleep 304"
    script = f"sh -c '{escape}' & {_IDENT}; sleep 0.2; exit 0"
    spec, status, receipt, idents = _run(
        tmp_path, script, launched, {"cgroup_root": str(root.path)}
    )
    for pid, _ticks in idents:
        launched.track_pid(pid)
    assert receipt["leftoversStopped"] == 1
    assert not any(_alive(*ident) for ident in idents)
    _assert_cgroup_gone(spec, status)


def test_keep_leaves_the_children_running(
    tmp_path: Path, launched: Launched, net: dict[str, Any]
) -> None:
    script = f"sleep 305 & {_IDENT}; setsid sleep 306 & {_IDENT}; exit 0"
    idents: list[tuple[int, int]] = []
    try:
        _spec, status, receipt, idents = _run(tmp_path, script, launched, net, leftovers="keep")
        assert receipt["exitCode"] == 0
        assert "leftoversStopped" not in receipt  # nothing was stopped, by choice
        assert status["cgroup"] is None  # keep: no cgroup of its own, nothing to remove later
        assert len(idents) == 2 and all(_alive(*ident) for ident in idents)
    finally:
        for pid, ticks in idents:
            kill_exact(pid, ticks)
    assert not any(_alive(*ident) for ident in idents)


def test_a_job_without_leftovers_reports_zero(
    tmp_path: Path, launched: Launched, net: dict[str, Any]
) -> None:
    spec, status, receipt, idents = _run(tmp_path, "exit 0", launched, net)
    assert idents == [] and receipt["leftoversStopped"] == 0
    _assert_cgroup_gone(spec, status)
