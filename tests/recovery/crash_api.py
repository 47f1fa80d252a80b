"""The api's execution wiring, halted at one named point of a start, to be SIGKILLed there.

``QLTEST_CRASH_AT``: ``after_t1`` (T1 committed, the launch not sent), ``after_launch`` (the
worker's answer received: it committed T2 with the spawn record) or ``before_t2`` (a worker
that leaves T2 to the api launched and journaled the job, T2 not committed). At that point the dispatching
thread touches ``QLTEST_CRASH_MARK`` and blocks forever. Everything else is the api process's
own composition (``build_context`` from the ``QL_*`` environment, its background drain and
its worker client); HTTP adds nothing to these windows, so none is served. Run as
``python -m tests.recovery.crash_api``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from app.adapters.worker_client import WorkerClient
from app.context.bootstrap import build_context
from app.settings import Settings
from app.storage.runs_repo import RunRepository
from tests.recovery.halt import halt


def _install(point: str) -> None:
    if point == "after_t1":
        begin = RunRepository.begin_dispatch

        def begin_then_halt(self: RunRepository, **kwargs: Any) -> Any:
            begin(self, **kwargs)  # committed: the crash comes before the launch
            halt()

        RunRepository.begin_dispatch = begin_then_halt  # type: ignore[method-assign]
    elif point == "after_launch":
        launch = WorkerClient.launch_recording

        def launch_then_halt(self: WorkerClient, request: Any) -> Any:
            launch(self, request)  # answered: whatever the worker committed stands
            halt()

        WorkerClient.launch_recording = launch_then_halt  # type: ignore[method-assign]
    elif point == "before_t2":

        def halt_instead(self: RunRepository, **kwargs: Any) -> Any:
            halt()  # the job runs and the journal knows it; T2 is never written

        RunRepository.record_running = halt_instead  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown crash point {point!r}")


if __name__ == "__main__":
    _install(os.environ["QLTEST_CRASH_AT"])
    context = build_context(Settings.from_env())
    context.start_background()
    context.background.enqueued()  # the drain an enqueue would start
    threading.Event().wait()
