"""``qinglong worker`` that halts at one named launch point, to be SIGKILLed there by a test.

``QLTEST_CRASH_AT``: ``reserved`` (the journal entry is committed, nothing is spawned yet) or
``spawned`` (the shim reported its handle, the journal has not recorded it). At that point the
launch thread touches ``QLTEST_CRASH_MARK`` and blocks forever; everything else is the real
worker. Run as ``python -m tests.recovery.crash_worker worker``.
"""

from __future__ import annotations

import os
from typing import Any

from app.cli import main
from app.storage.journal_repo import JournalRepository
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
    else:
        raise SystemExit(f"unknown crash point {point!r}")


if __name__ == "__main__":
    _install(os.environ["QLTEST_CRASH_AT"])
    raise SystemExit(main())
