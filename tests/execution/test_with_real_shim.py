"""The dispatcher driving the worker's real launcher and shim: one real job, end to end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.artifacts import log_relpath
from app.domain.execution import LaunchRequest
from app.domain.model import ProcessHandle
from app.execution.dispatcher import build_dispatcher
from app.storage.definitions_repo import DefinitionRepository
from app.storage.journal_repo import JournalRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.identity import ProcessIdentity, read_identity, stop_identity, wait_exit
from app.worker.launcher import IdentityController, ShimLauncher
from app.worker.receipts import ReceiptStore
from tests.execution.kit import FakeDisk, FakeSettings, MemorySecrets, enqueue

SECRET = "real-shim-secret-value"


class TrackingLauncher:
    """The real ShimLauncher, remembering handles so teardown can stop survivors."""

    def __init__(self, inner: ShimLauncher) -> None:
        self.inner = inner
        self.handles: list[ProcessHandle] = []

    def launch(self, request: LaunchRequest) -> ProcessHandle:
        handle = self.inner.launch(request)
        self.handles.append(handle)
        return handle


@pytest.fixture
def launcher(engine: Engine, tmp_path: Path) -> Iterator[TrackingLauncher]:
    tracking = TrackingLauncher(
        ShimLauncher(
            journal=JournalRepository(engine), receipts=ReceiptStore(tmp_path / "receipts")
        )
    )
    yield tracking
    tracking.inner.close()
    for h in tracking.handles:
        for pid in (h.pid, h.shim_pid):
            ident = read_identity(pid)
            if ident is not None:
                stop_identity(ProcessIdentity(ident.boot_id, pid, ident.pgid, ident.start_ticks),
                              grace_seconds=1.0)


def test_real_job_sees_exactly_the_recipe_values_secrets_and_ql3_ids(
    engine: Engine, tmp_path: Path, launcher: TrackingLauncher
) -> None:
    """Through the real shim the job's environment is the frozen one and nothing inherited."""
    repo = DefinitionRepository(engine)
    rid = repo.put_recipe(env={"MODE": "fast"}, secrets={"TOKEN": "api"})[0].id
    repo.put_revision(
        task="envdump", revision=1, executor="local_process", argv=["/usr/bin/env"],
        cwd=None, recipe=rid, timeout_seconds=60, priority=0,
    )
    run = enqueue(engine, task="envdump")
    logs = tmp_path / "logs"
    dispatcher = build_dispatcher(
        candidates=RunReader(engine),
        definitions=repo,
        secrets=MemorySecrets({"api": SECRET}),
        transitions=RunRepository(engine),
        launcher=launcher,
        controller=IdentityController(),
        settings_like=FakeSettings(logs),
        disk=FakeDisk(),
    )
    result = dispatcher.run_pass()
    assert result.activated is not None and result.activated.kind == "started", result
    after = RunReader(engine).get_run(run.id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("running", "running")
    handle = launcher.handles[0]
    assert wait_exit(handle.shim_pid, 20.0), "the shim did not finish"
    log = logs / log_relpath(after.latest_attempt.id)
    deadline = time.monotonic() + 20
    while not log.read_bytes().endswith(b"\n") and time.monotonic() < deadline:
        time.sleep(0.01)
    lines = log.read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines)
    assert env == {
        "MODE": "fast",
        "TOKEN": SECRET,
        "QL3_RUN_ID": run.id,
        "QL3_ATTEMPT_ID": after.latest_attempt.id,
        "QL3_ATTEMPT_NUMBER": "1",
        "QL3_TASK": "envdump",
        "QL3_REVISION": "1",
    }
