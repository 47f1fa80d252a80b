"""Timeouts and cancellation in the worker (docs/design.md §3.14).

The database is the authority: an expired ``deadline_at_ms`` first commits
``run.cancel_requested`` with reason ``timeout``; only then is the exact identity stopped
(TERM, the profile's grace, identity re-checked, KILL). A user intent is committed by the
api; the worker only stops. The ending then arrives as the shim's receipt and the completion
transaction maps it to ``timed_out``/``cancelled`` from the committed intent, whatever the
exit code, so a success receipt arriving after an accepted intent cannot win.

A sweep reads one bounded page of candidates (deadline passed or intent present) with a
resume cursor; stops run on their own threads so one job ignoring TERM never delays others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from app.domain.errors import DomainError
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle, plausible_handle
from app.domain.profiles import Profile
from app.execution.ports import ActiveAttemptSource, CancelIntents, ProcessController

log = logging.getLogger(__name__)

_REMEMBER_MAX = 4096  # attempts already stopped, so a sweep does not signal them again


class CancellationSweep:
    """Commits timeout intents and stops attempts whose run must end."""

    def __init__(
        self,
        *,
        attempts: ActiveAttemptSource,
        intents: CancelIntents,
        controller: ProcessController,
        profile: Profile,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._attempts = attempts
        self._intents = intents
        self._controller = controller
        self._profile = profile
        self._clock = clock
        self._cursor: str | None = None
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Thread] = {}
        self._stopped: set[str] = set()

    def run_once(self) -> int:
        """One bounded page; returns how many stops were started."""
        size = self._profile.reconcile_page_size
        page = self._attempts.stop_candidates(
            now_ms=self._clock(), limit=size, after_id=self._cursor
        )
        self._cursor = page[-1].attempt_id if len(page) == size else None
        started = 0
        for attempt in page:
            if attempt.cancel_reason is None:
                # Deadline passed: persist the intent before any signal (docs/design.md §3.14).
                try:
                    # For this attempt only: once it ended, a retry may have followed it,
                    # with its own deadline (docs/retries.md §2).
                    self._intents.request_cancel(
                        run_id=attempt.run_id, reason="timeout", attempt_id=attempt.attempt_id
                    )
                except DomainError:
                    continue  # it ended meanwhile (RUN_TERMINAL) or vanished: nothing to stop
            if attempt.status != "running" or not plausible_handle(attempt.handle):
                # starting: T2 makes it running (stopped next sweep) or the reconciler
                # decides; an unverifiable handle is never signalled.
                continue
            assert attempt.handle is not None
            deadline = attempt.cancel_reason in (None, "timeout")
            if self._start_stop(attempt.attempt_id, attempt.handle, deadline=deadline):
                started += 1
        return started

    def _start_stop(self, attempt_id: str, handle: ProcessHandle, *, deadline: bool) -> bool:
        with self._lock:
            if attempt_id in self._inflight or attempt_id in self._stopped:
                return False
            thread = threading.Thread(
                target=self._stop,
                args=(attempt_id, handle, deadline),
                name="ql-stop",
                daemon=True,
            )
            self._inflight[attempt_id] = thread
        thread.start()
        return True

    def _stop(self, attempt_id: str, handle: ProcessHandle, deadline: bool) -> None:
        result = "unknown"
        try:
            result = self._controller.stop(handle, grace_seconds=self._profile.stop_grace_s)
        except Exception as exc:  # the port raises nothing; a bug must not kill the thread
            log.warning("stop failed: %s", type(exc).__name__)
        with self._lock:
            self._inflight.pop(attempt_id, None)
            if result in ("stopped", "already_exited"):
                if len(self._stopped) >= _REMEMBER_MAX:
                    self._stopped.clear()
                self._stopped.add(attempt_id)
        # Which attempt, and why: its deadline, or a cancel intent (a user's, or serve's
        # --stop-jobs-on-exit); the stored reason itself is not written (any string a newer
        # build stores is read).
        why = "after its deadline" if deadline else "after a cancel intent"
        log.info("stop of attempt %s %s: %s", attempt_id, why, result)

    def close(self, timeout: float) -> None:
        """Wait (bounded) for stops in flight."""
        with self._lock:
            threads = list(self._inflight.values())
        for thread in threads:
            thread.join(timeout)
