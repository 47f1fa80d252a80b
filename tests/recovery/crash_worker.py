"""``qinglong worker`` that halts at one named launch point, to be SIGKILLed there by a test.

``QLTEST_CRASH_AT``: ``reserved`` (the journal entry is committed, nothing is spawned yet) or
``spawned`` (the shim reported its handle; neither the journal's ``spawned`` nor T2, which
commit together, is written). At that point the
launch thread touches ``QLTEST_CRASH_MARK`` and blocks forever; everything else is the real
worker. Run as ``python -m tests.recovery.crash_worker worker``.
"""

from __future__ import annotations

import os
from typing import Any

from app.cli import main
from app.storage.journal_repo import JournalRepository
from app.storage.runs_repo import RunRepository
from tests.recovery.halt import halt


def _install(point: str) -> None:
    if point == "reserved":
        reserve = JournalRepository.reserve

        def reserve_then_halt(self: JournalRepository, **kwargs: Any) -> Any:
            reserve(self, **kwargs)  # committed: the crash comes after the reserve
            halt()

        JournalRepository.reserve = reserve_then_halt  # type: ignore[method-assign]
    elif point == "spawned":

        def halt_before_record(self: JournalRepository, **kwargs: Any) -> Any:
            halt()  # the shim and its job run; ``spawned`` is never written

        JournalRepository.record_spawned = halt_before_record  # type: ignore[method-assign]
        RunRepository.record_spawned_running = halt_before_record  # type: ignore[method-assign,assignment]
    else:
        raise SystemExit(f"unknown crash point {point!r}")


if __name__ == "__main__":
    _install(os.environ["QLTEST_CRASH_AT"])
    raise SystemExit(main())
