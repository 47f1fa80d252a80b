"""Exact stop (docs/design.md §3.10) with real processes: the coordinator's compensation through the worker's
exact-identity stop (pidfd, identity re-checked before TERM and before KILL)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.execution import LaunchRequest, StopResult
from app.domain.model import ProcessHandle
from app.domain.profiles import STANDALONE
from app.worker.identity import ProcessIdentity, current_boot_id, read_identity, stop_identity
from tests.execution.kit import FakeLauncher, FlakyTransitions, define, enqueue, make_kit

PROFILE = dataclasses.replace(STANDALONE, stop_grace_s=0.3)


class IdentityController:
    """The ProcessController port over the worker's exact stop; counts calls."""

    def __init__(self) -> None:
        self.results: list[StopResult] = []

    def stop(self, handle: ProcessHandle, *, grace_seconds: float) -> StopResult:
        identity = ProcessIdentity.of_job(handle)
        result = stop_identity(identity, grace_seconds=grace_seconds)
        self.results.append(result)
        return result


@pytest.fixture
def jobs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Real jobs in their own process groups, killed by pid and reaped afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(timeout=10)


def _spawner(
    jobs: list[subprocess.Popen[bytes]], script: str, *, wrong_ticks: bool = False
) -> object:
    def launch(_: LaunchRequest) -> ProcessHandle:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script], start_new_session=True, stdout=subprocess.PIPE
        )
        jobs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"  # its signal dispositions are in place
        proc.stdout.close()
        deadline = time.monotonic() + 5
        identity = read_identity(proc.pid)
        while identity is None and time.monotonic() < deadline:
            identity = read_identity(proc.pid)
        assert identity is not None
        ticks = identity.start_ticks + (1 if wrong_ticks else 0)
        return ProcessHandle(
            boot_id=current_boot_id(),
            pid=proc.pid,
            pgid=identity.pgid,
            start_ticks=ticks,
            shim_pid=os.getpid(),
            shim_start_ticks=1,
        )

    return launch


@pytest.mark.parametrize(
    ("script", "ended_by"),
    [
        ("echo ready; exec sleep 30", -15),
        ("trap '' TERM; echo ready; sleep 30 & wait; sleep 30", -9),
    ],
    ids=["term", "kill"],
)
def test_controller_stops_the_verified_identity_with_term_then_kill_before_lost(
    engine: Engine,
    tmp_path: Path,
    jobs: list[subprocess.Popen[bytes]],
    script: str,
    ended_by: int,
) -> None:
    """Identity verified, TERM, bounded grace, re-verified, KILL; then lost."""
    define(engine)
    run = enqueue(engine)
    controller = IdentityController()
    kit = make_kit(
        engine,
        tmp_path / "logs",
        profile=PROFILE,
        launcher=FakeLauncher(engine, handle=_spawner(jobs, script)),  # type: ignore[arg-type]
        controller=controller,
        transitions=FlakyTransitions(engine, fail_t2=True),
    )
    kit.dispatcher.run_pass()

    assert controller.results == ["stopped"]
    assert jobs[0].wait(timeout=10) == ended_by  # TERM within the grace, else KILL
    after = kit.run(run.id)
    assert (after.status, after.latest_attempt.status if after.latest_attempt else None) == (
        "lost",
        "lost",
    )


def test_mismatched_identity_gets_no_signal(
    engine: Engine, tmp_path: Path, jobs: list[subprocess.Popen[bytes]]
) -> None:
    """A handle whose start ticks do not match the live pid is never signalled."""
    define(engine)
    enqueue(engine)
    controller = IdentityController()
    kit = make_kit(
        engine,
        tmp_path / "logs",
        profile=PROFILE,
        launcher=FakeLauncher(
            engine, handle=_spawner(jobs, "echo ready; exec sleep 30", wrong_ticks=True)  # type: ignore[arg-type]
        ),
        controller=controller,
        transitions=FlakyTransitions(engine, fail_t2=True),
    )
    kit.dispatcher.run_pass()

    assert controller.results == ["already_exited"]  # not this identity: nothing was sent
    assert jobs[0].poll() is None  # the real process is untouched
