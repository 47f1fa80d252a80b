"""The worker's line for each stop it makes names the attempt and why it was stopped.

Before, a timed-out job and a cancelled one both logged ``stop after cancel intent:
stopped``: no attempt to look up, and a deadline called a cancel intent.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from sqlalchemy import Engine

from app.domain.canonical import sha256_digest
from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.execution.cancellation import CancellationSweep
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.storage.helpers import HANDLE, TOKEN, enqueue


def _stop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return sorted(r.getMessage() for r in caplog.records if "stop" in r.getMessage())


class _Stops:
    def stop(self, handle: Any, **_: Any) -> str:
        return "stopped"


def _running(engine: Engine, deadline_at_ms: int | None) -> tuple[str, str]:
    repo = RunRepository(engine)
    run = enqueue(engine)
    assert run.latest_attempt is not None
    attempt_id = run.latest_attempt.id
    repo.begin_dispatch(
        run_id=run.id, attempt_id=attempt_id, expected_version=run.version,
        token_digest=sha256_digest(TOKEN.encode()), deadline_at_ms=deadline_at_ms,
        log_artifact_id="log:" + attempt_id,
    )  # fmt: skip
    repo.record_running(run_id=run.id, attempt_id=attempt_id, handle=HANDLE, started_at_ms=now_ms())
    return run.id, attempt_id


def test_each_stop_line_names_its_attempt_and_whether_a_deadline_or_a_cancel_stopped_it(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    DefinitionRepository(engine).put_revision(
        task="job", revision=1, executor="local_process", argv=["/bin/true"], cwd=None,
        recipe=None, timeout_seconds=1, priority=0,
    )  # fmt: skip
    repo = RunRepository(engine)
    _, timed_out = _running(engine, deadline_at_ms=now_ms() - 1)
    run_id, cancelled = _running(engine, deadline_at_ms=None)
    repo.request_cancel(run_id=run_id, reason="user")
    sweep = CancellationSweep(
        attempts=RunReader(engine), intents=repo,
        controller=_Stops(),  # type: ignore[arg-type]
        profile=EDGE,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="app.execution.cancellation"):
        assert sweep.run_once() == 2
        sweep.close(10.0)
        deadline = time.monotonic() + 10  # a stop's thread leaves the in-flight set, then logs
        while len(_stop_lines(caplog)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = _stop_lines(caplog)
    assert lines == sorted([
        f"stop of attempt {timed_out} after its deadline: stopped",
        f"stop of attempt {cancelled} after a cancel intent: stopped",
    ])  # fmt: skip
