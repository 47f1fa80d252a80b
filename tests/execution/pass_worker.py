"""A dispatcher process for the multi-process test: passes until no candidate is left.

Usage: ``python -m tests.execution.pass_worker <db_url> <logs_dir> <launch_log> [max_running]``.
Each launch appends the attempt id to ``launch_log`` (one O_APPEND write per line, so lines
never mix). With ``max_running`` the dispatcher has that global budget and the process stops
at its first pass that finds it used up.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from app.domain.execution import LaunchRequest
from app.domain.model import ProcessHandle
from app.execution.dispatcher import build_dispatcher
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import FakeController, FakeDisk, FakeSettings, MemorySecrets


class AppendingLauncher:
    """Records each launch durably in a shared file; never starts anything."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def launch(self, request: LaunchRequest) -> ProcessHandle:
        os.write(self._fd, (request.attempt_id + "\n").encode())
        return ProcessHandle(
            boot_id="b", pid=os.getpid(), pgid=os.getpid(), start_ticks=1, shim_pid=1,
            shim_start_ticks=1,
        )


def main(db_url: str, logs_dir: str, launch_log: str, max_running: str | None = None) -> int:
    """Run passes until the queue is empty (bounded)."""
    engine = make_engine(db_url)
    reader = RunReader(engine)
    dispatcher = build_dispatcher(
        candidates=reader,
        definitions=DefinitionRepository(engine),
        secrets=MemorySecrets(),
        transitions=RunRepository(engine),
        launcher=AppendingLauncher(launch_log),
        controller=FakeController(),
        settings_like=FakeSettings(Path(logs_dir)),
        disk=FakeDisk(),
        max_running=int(max_running) if max_running else None,
    )
    for _ in range(10_000):
        if not reader.dispatch_candidates(limit=1).items:
            break
        result = dispatcher.run_pass()
        if any(o.kind == "error" for o in result.outcomes):
            print(result, file=sys.stderr)
            return 2
        if result.at_capacity:
            break
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
