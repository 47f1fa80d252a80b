"""Wires the api's private execution kernel: worker client, dispatcher, the drain hook.

The dispatcher is reachable only through the hooks built here (DESIGN.md, AppContext): the
facade never sees it, the launcher or the coordinator.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from app.execution.dispatcher import Dispatcher, PassResult, build_dispatcher
from app.execution.ports import (
    CandidateSource,
    DefinitionSource,
    RunTransitions,
    SecretSource,
)
from app.settings import Settings
from app.worker.client import WorkerClient, WorkerUnavailable

log = logging.getLogger("qinglong.dispatch")

# One drain runs passes until a pass activates nothing; each pass is bounded by the profile's
# page size and stops after one activation (ADR-0071 §3), so a drain is bounded too.
MAX_PASSES_PER_DRAIN = 256
# The readiness ping's own budget: one try, well inside the probe's deadline (a stopped
# worker must make /readyz say so, not hang it for the client's 30 s read timeout).
READY_PING_TIMEOUT_S = 0.4


def drain_concurrency(page_size: int) -> int:
    """How many passes one drain runs at once: edge (page 4) 1, standalone (page 16) 4.

    A launch spends most of its time waiting for the shim's status line (interpreter
    start-up), so overlapping passes multiply throughput. Overlap is safe by construction:
    every claim is a database compare-and-set (DESIGN.md, AppContext; ADR-0071 §3).
    """
    return max(1, min(4, page_size // 4))


@dataclass(frozen=True)
class ExecutionHooks:
    """What the composition root plugs into the background thread and readiness."""

    drain: Callable[[], None]
    worker_ready: Callable[[], str | None]
    nudge_worker: Callable[[], None]
    close: Callable[[], None]


def build_execution(
    settings: Settings,
    *,
    candidates: CandidateSource,
    definitions: DefinitionSource,
    secrets: SecretSource,
    transitions: RunTransitions,
    client: WorkerClient | None = None,
) -> ExecutionHooks:
    """Build the worker client and the dispatcher; return the hooks that drive them."""
    worker = client or WorkerClient(settings.socket_path, connect_timeout_s=1.0)
    drainers = drain_concurrency(settings.profile.dispatch_page_size)
    dispatcher = build_dispatcher(
        candidates=candidates,
        definitions=definitions,
        secrets=secrets,
        transitions=transitions,
        launcher=worker,
        controller=worker,
        settings_like=settings,
    )

    def drain() -> None:
        # No worker, no dispatch: runs stay queued (never failed) until it answers again.
        try:
            worker.ping()
        except WorkerUnavailable:
            return
        _drain_concurrently(dispatcher, drainers)

    def worker_ready() -> str | None:
        try:
            worker.ping(timeout_s=READY_PING_TIMEOUT_S)
        except WorkerUnavailable:
            return "worker socket not answering"
        return None

    def nudge_worker() -> None:
        wake = getattr(worker, "wake", None)
        if wake is None:
            return
        with contextlib.suppress(WorkerUnavailable):
            wake()

    return ExecutionHooks(
        drain=drain, worker_ready=worker_ready, nudge_worker=nudge_worker, close=worker.close
    )


def _drain_concurrently(dispatcher: Dispatcher, drainers: int) -> None:
    """Drain; only when the first pass activated a run, add ``drainers - 1`` helper threads.

    The slow loop ticks every few seconds with usually nothing queued: one pass in this
    thread answers that without starting any thread.
    """
    if drainers <= 1:
        _drain(dispatcher)
        return
    if not _log_pass(dispatcher.run_pass()):
        return
    helpers = [
        threading.Thread(target=_drain_logged, args=(dispatcher,), name="ql-drain", daemon=True)
        for _ in range(drainers - 1)
    ]
    for thread in helpers:
        thread.start()
    try:
        _drain(dispatcher)
    finally:
        for thread in helpers:
            thread.join()


def _drain_logged(dispatcher: Dispatcher) -> None:
    try:
        _drain(dispatcher)
    except Exception as exc:  # a failed pass is retried by the next kick or tick
        log.error("background pass failed: %s", type(exc).__name__)


def _drain(dispatcher: Dispatcher) -> None:
    for _ in range(MAX_PASSES_PER_DRAIN):
        if not _log_pass(dispatcher.run_pass()):
            return


def _log_pass(result: PassResult) -> bool:
    """Log a launch that did not end running; True when another pass may find work."""
    failure = result.launch_failure
    if failure is not None:
        # Ids and stable codes only: never argv, environment or output.
        log.warning(
            "run %s attempt %s did not start: %s %s",
            failure.run_id,
            failure.attempt_id,
            failure.kind,
            failure.error_code or failure.reason or "",
        )
    return result.activated is not None or result.truncated
