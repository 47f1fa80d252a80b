"""No process of a job outlives its run (docs/leftovers.md), against a real ``qinglong serve``.

Twice each: with the worker's default (``cgroup``: each job in its own cgroup v2 under the
worker's cgroup; skipped, with the reason, where no writable cgroup v2 hierarchy exists) and
with ``QL_CGROUP_ROOT=off`` (``tree``: the process group and the shim's subreaper tree only).
Jobs print the identity (pid, start ticks) of each background child, so "gone" is checked
against that very process; children kept on purpose are killed by that identity at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.worker import cgroups
from tests.e2e.conftest import Served, ServeFactory, alive, kill_exact, wait_until
from tests.e2e.kit import enqueue, events, put_task, read_log, wait_status
from tests.kit import web

pytestmark = pytest.mark.e2e

_IDENT = 'echo $! $(cut -d" " -f22 /proc/$!/stat)'


@pytest.fixture(scope="module", params=["cgroup", "tree"])
def served(request: pytest.FixtureRequest, module_serve_factory: ServeFactory) -> Served:
    if request.param == "tree":
        return module_serve_factory(extra_env={"QL_CGROUP_ROOT": "off"})
    if cgroups.detect(cgroups.AUTO) is None:
        pytest.skip("no writable cgroup v2 hierarchy here: only the process-tree path runs")
    return module_serve_factory()


def _children(served: Served, run_id: str, count: int) -> list[tuple[int, int]]:
    wait_until("the job to print its children", lambda: _lines(served, run_id) >= count, 30)
    return [(int(p), int(t)) for p, t in (ln.split() for ln in _log_lines(served, run_id))]


def _log_lines(served: Served, run_id: str) -> list[str]:
    return [ln for ln in read_log(served, run_id).decode().splitlines() if ln[:1].isdigit()]


def _lines(served: Served, run_id: str) -> int:
    return len(_log_lines(served, run_id))


def _ending(served: Served, run_id: str, status: str) -> dict[str, object]:
    (event,) = [e for e in events(served, run_id) if e["type"] == f"attempt.{status}"]
    data: dict[str, object] = event["data"]
    return data


def _no_cgroup_left(served: Served, run_id: str) -> None:
    root = cgroups.detect(cgroups.AUTO)
    r = web.get(f"{served.base_url}/api/v1/runs/{run_id}/attempts", headers=served.auth)
    attempt = r.json()["items"][-1]["id"]
    if root is not None:
        assert not (root.path / f"{cgroups.PREFIX}{attempt}").exists()


def test_background_and_setsid_children_end_with_a_succeeded_run(
    served: Served, tmp_path: Path
) -> None:
    script = f"sleep 301 & {_IDENT}; setsid sleep 302 & {_IDENT}; exit 0"
    put_task(served, "leaves-two", script, tmp_path)
    run_id = enqueue(served, "leaves-two")
    run = wait_status(served, run_id, {"succeeded", "failed", "lost"})
    assert run["status"] == "succeeded"
    children = _children(served, run_id, 2)
    assert _ending(served, run_id, "succeeded")["leftovers_stopped"] == 2
    assert not any(alive(pid, ticks) for pid, ticks in children)
    _no_cgroup_left(served, run_id)


def test_cancel_stops_a_child_that_left_the_session(served: Served, tmp_path: Path) -> None:
    # The main process then is the only member of its group: the count is the escapee alone.
    script = f"setsid sleep 303 & {_IDENT}; exec sleep 3000"
    put_task(served, "escapes", script, tmp_path)
    run_id = enqueue(served, "escapes")
    wait_status(served, run_id, {"running"})
    ((pid, ticks),) = _children(served, run_id, 1)
    wait_until("the child to run in its own session", lambda: _own_session(pid), 10)
    try:
        r = web.post(f"{served.base_url}/api/v1/runs/{run_id}/cancel", headers=served.auth)
        assert r.status_code in (200, 202), r.text
        run = wait_status(served, run_id, {"cancelled", "failed", "lost", "succeeded"})
        assert run["status"] == "cancelled"
        wait_until("the setsid child to be gone", lambda: not alive(pid, ticks), 10)
        assert _ending(served, run_id, "cancelled")["leftovers_stopped"] == 1
        _no_cgroup_left(served, run_id)
    finally:
        kill_exact(pid, ticks)


def test_a_timeout_stops_a_child_that_left_the_session(served: Served, tmp_path: Path) -> None:
    script = f"setsid sleep 306 & {_IDENT}; exec sleep 3000"
    put_task(served, "times-out", script, tmp_path, timeout_seconds=1)
    run_id = enqueue(served, "times-out")
    ((pid, ticks),) = _children(served, run_id, 1)
    try:
        run = wait_status(served, run_id, {"timed_out", "cancelled", "failed", "lost"})
        assert run["status"] == "timed_out"
        wait_until("the setsid child to be gone", lambda: not alive(pid, ticks), 10)
        _no_cgroup_left(served, run_id)
    finally:
        kill_exact(pid, ticks)


def _own_session(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except ProcessLookupError:
        return False


def test_keep_leaves_the_children_running(served: Served, tmp_path: Path) -> None:
    script = f"sleep 304 & {_IDENT}; setsid sleep 305 & {_IDENT}; exit 0"
    put_task(served, "keeps-two", script, tmp_path, leftovers="keep")
    run_id = enqueue(served, "keeps-two")
    children: list[tuple[int, int]] = []
    try:
        run = wait_status(served, run_id, {"succeeded", "failed", "lost"})
        assert run["status"] == "succeeded"
        children = _children(served, run_id, 2)
        assert "leftovers_stopped" not in _ending(served, run_id, "succeeded")
        assert all(alive(pid, ticks) for pid, ticks in children)
    finally:
        for pid, ticks in children:
            kill_exact(pid, ticks)
    assert not any(alive(pid, ticks) for pid, ticks in children)
