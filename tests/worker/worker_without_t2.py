"""``qinglong worker`` that journals a spawn without writing T2, as workers did before T2 moved
into the worker's spawn transaction (docs/design.md §3.7).

Recovery must still settle what such a worker left behind (an attempt ``starting`` whose
journal entry is ``spawned``): data written before an upgrade, or the window a test holds
open on purpose, the launch answered and T2 never committed by anyone. Run as
``python -m tests.worker.worker_without_t2 worker``.
"""

from __future__ import annotations

from typing import Any, Literal

from app.cli import main
from app.storage.journal_repo import JournalRepository
from app.storage.runs_repo import RunRepository


def _journal_only(
    self: RunRepository, *, run_id: str, attempt_id: str, handle: Any, started_at_ms: int
) -> Literal["spawned", "not_reserved"]:
    moved = JournalRepository(self._engine).record_spawned(attempt_id=attempt_id, handle=handle)
    return "spawned" if moved else "not_reserved"


RunRepository.record_spawned_running = _journal_only  # type: ignore[method-assign,assignment]

if __name__ == "__main__":
    raise SystemExit(main())
