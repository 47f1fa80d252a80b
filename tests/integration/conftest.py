"""The ``launched`` fixture: everything a shim launch started is stopped at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.domain.model import ProcessHandle
from tests.worker.kit import Processes


class Launched(Processes):
    """Processes of the worker kit, fed from shim status lines; stopped by verified identity
    (never by name) if still alive at teardown."""

    def track_status(self, status: dict[str, Any]) -> None:
        if status.get("ok"):
            self.track(
                ProcessHandle(
                    boot_id=status["boot_id"],
                    pid=status["pid"],
                    pgid=status["pgid"],
                    start_ticks=status["start_ticks"],
                    shim_pid=status["shim_pid"],
                    shim_start_ticks=status["shim_start_ticks"],
                )
            )


@pytest.fixture
def launched() -> Iterator[Launched]:
    tracker = Launched()
    try:
        yield tracker
    finally:
        tracker.cleanup()
