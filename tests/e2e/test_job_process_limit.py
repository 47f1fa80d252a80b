"""QL_JOB_MAX_PROCESSES through a real ``qinglong serve`` (docs/job-user.md "Process limit").

With ``QL_JOB_USER=nobody`` and a limit of 10, a job that tries to start 50 ``sleep``
children has the forks past the limit refused with EAGAIN, exits with its own status 7, and
its run says exactly that: ``failed``, exit code 7, the children it did start counted as
leftovers stopped, none of them alive afterwards. The worker's start line names the limit.
Without a job user (and without pids.max for job cgroups, as on this kind of host) the same
setting cannot hold and the start line warns instead of staying silent.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import pytest

from app.worker import cgroups
from tests.e2e.conftest import ServeFactory
from tests.e2e.kit import enqueue, events, put_task, read_log, wait_status
from tests.jobuser import job_user_or_skip, reachable_dir
from tests.kit.fork_bomb import (
    EXIT,
    JOB,
    LIMIT,
    TRIES,
    job_counts,
    marked,
    no_survivors,
    python_for_job,
)


@pytest.fixture
def marker() -> Iterator[str]:
    with no_survivors() as value:
        yield value


@pytest.mark.e2e
def test_a_fork_bomb_meets_the_limit_and_the_run_records_the_jobs_own_ending(
    serve_factory: ServeFactory, marker: str
) -> None:
    user = job_user_or_skip()
    with reachable_dir() as root:
        served = serve_factory(
            data_dir=root / "data",
            extra_env={"QL_JOB_USER": user, "QL_JOB_MAX_PROCESSES": str(LIMIT)},
        )
        script = f"exec {python_for_job()} -I -S -c {shlex.quote(JOB)} {marker}"
        put_task(served, "bomb", script, cwd=root)
        run_id = enqueue(served, "bomb")
        run = wait_status(served, run_id, {"succeeded", "failed", "lost"}, timeout=60)
        log = read_log(served, run_id).decode()
        ending = [e for e in events(served, run_id) if e["type"] == "attempt.failed"]
        assert not marked(marker), "a child of the job outlived its run"
        served.stop()
        start_log = served.log()
    assert run["status"] == "failed" and run["latest_attempt"]["exit_code"] == EXIT, run
    counts = job_counts(log)
    assert counts["started"] + counts["refused"] == TRIES and counts["other"] == 0, counts
    assert counts["started"] <= LIMIT - 1, counts
    assert len(ending) == 1 and ending[0]["data"]["exit_code"] == EXIT, ending
    assert ending[0]["data"]["leftovers_stopped"] == counts["started"], ending
    assert f"process limit {LIMIT} per job" in start_log, start_log


@pytest.mark.e2e
def test_where_the_limit_cannot_hold_the_worker_says_so_when_it_starts(
    serve_factory: ServeFactory,
) -> None:
    root = cgroups.detect(cgroups.AUTO)  # the worker's own cgroup is this test's
    if cgroups.pids_problem(root) is None:
        pytest.skip("job cgroups have pids.max here: the limit holds for every job")
    served = serve_factory(extra_env={"QL_JOB_MAX_PROCESSES": str(LIMIT)})
    served.stop()
    line = next(
        (ln for ln in served.log().splitlines() if "QL_JOB_MAX_PROCESSES" in ln), served.log()
    )
    assert "WARNING" in line and f"QL_JOB_MAX_PROCESSES={LIMIT} is not enforced" in line, line
