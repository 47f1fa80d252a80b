"""Bounded dispatcher pass (docs/design.md §3.3): one page, in order, stop after the first launch.

Admission (docs/design.md §3.3 step 7, docs/concurrency-budgets.md §2): a pass that finds
QL_MAX_RUNNING runs active reads no page; a candidate whose task is at its revision's
``max_concurrent`` is skipped and the rest of the page examined, and so is a candidate the
source marks ``held`` (a schedule's queue_one/replace run waiting behind an older run of its
schedule, docs/schedules.md §5), without a query, an event or a write.

Uniqueness comes from compare-and-set in the database alone (docs/design.md §3.7): several processes
may run passes at once. The dispatcher owns no timer, thread or queue; its only state is the
keyset cursor it resumes from when a page was truncated without an activation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypedDict

from app.domain.errors import (
    AdmissionRefused,
    ErrorCode,
    InvalidTransition,
    KeyUnavailable,
    NotFound,
    StorageUnavailable,
    VersionConflict,
)
from app.execution.coordinator import LAUNCH_OUTCOME_UNKNOWN, StartCoordinator, StartResult
from app.execution.materializer import (
    ArtifactRefused,
    CandidateGone,
    LogSpares,
    Materializer,
    RunFailedBeforeStart,
    SettingsLike,
    StartCommand,
)
from app.execution.ports import (
    CandidateSource,
    DefinitionSource,
    DiskProbe,
    DispatchCandidateLike,
    Launcher,
    ProcessController,
    RunTransitions,
    SecretSource,
)

OutcomeKind = Literal[
    "started",  # T2 committed: the run is running
    "start_failed",  # launch failed before a handle: run failed, EXECUTOR_START_FAILED
    "lost",  # T2 failed, exact stop succeeded: run lost
    "ended",  # T2 lost to the job's own ending (a very fast job): the run is terminal
    "unresolved",  # left dispatching/starting for the reconciler
    "requeued",  # no executor, nothing spawned: queued again with a fresh attempt
    "failed_before_start",  # missing revision/recipe/secret, bad env
    "skipped_race",  # somebody else moved the candidate first
    "artifact_refused",  # the log artifact could not be created safely; run stays queued
    "at_capacity",  # QL_MAX_RUNNING runs are active: run stays queued, the pass stopped
    "task_at_capacity",  # its task is at max_concurrent: run stays queued, the pass goes on
    "held",  # waits behind an older run of its schedule: run stays queued, the pass goes on
    "disk_low",  # free space below the reserve + a log's quota: run stays queued, pass stopped
    "error",  # an unexpected failure; the pass stopped
]
_LAUNCHED = frozenset({"started", "start_failed", "lost", "ended", "unresolved", "requeued"})
# Kept queued until some active run ends (the budget poll, docs/concurrency-budgets.md §4).
_WAITING = frozenset({"task_at_capacity", "held"})


@dataclass(frozen=True, slots=True)
class CandidateOutcome:
    """What one pass did with one candidate (ids and stable codes only)."""

    run_id: str
    attempt_id: str
    kind: OutcomeKind
    error_code: str | None = None
    reason: str | None = None
    created_to_started_ms: int | None = None  # a start that reached running (the metric)


class _Ids(TypedDict):
    run_id: str
    attempt_id: str


@dataclass(frozen=True, slots=True)
class PassResult:
    """One pass: the candidates it examined, in order, and whether the page was truncated."""

    outcomes: tuple[CandidateOutcome, ...]
    truncated: bool
    # The pass found QL_MAX_RUNNING runs active before (or while) examining its page.
    at_capacity: bool = False
    # The page held candidates after the one the pass stopped at: another pass may take one.
    # Without them (and not truncated) the queue held nothing more when the page was read,
    # and a run enqueued since kicks a drain of its own.
    more_in_page: bool = False

    @property
    def budget_blocked(self) -> bool:
        """A budget kept a candidate queued: it may start once some active run ends."""
        return self.at_capacity or any(o.kind in _WAITING for o in self.outcomes)

    @property
    def disk_low(self) -> bool:
        """A candidate waits for free space: no other pass now (the next tick tries again)."""
        return any(o.kind == "disk_low" for o in self.outcomes)

    @property
    def activated(self) -> CandidateOutcome | None:
        """The one candidate the launcher was called for, if any."""
        return next((o for o in self.outcomes if o.kind in _LAUNCHED), None)

    @property
    def launch_failure(self) -> CandidateOutcome | None:
        """The launch that did not start, reported to the caller (never retried here).

        ``ended`` is a start too: the job ran and finished before T2 could commit.
        """
        found = self.activated
        return found if found is not None and found.kind not in ("started", "ended") else None

    @property
    def worker_unavailable(self) -> bool:
        """The launch found no executor (or no answer): the caller must back off
        (docs/design.md §3.3, no silent retry storm), not run another pass at once."""
        found = self.activated
        return found is not None and (
            found.error_code == ErrorCode.EXECUTOR_UNAVAILABLE
            or found.reason == LAUNCH_OUTCOME_UNKNOWN
        )


CoordinatorFactory = Callable[[], StartCoordinator]
_REFUSED: dict[str, OutcomeKind] = {"global": "at_capacity", "held": "held"}
_RACES = (VersionConflict, InvalidTransition, CandidateGone)


class Dispatcher:
    """Runs bounded passes; call ``run_pass`` after an enqueue and from a slow loop."""

    def __init__(
        self,
        *,
        candidates: CandidateSource,
        materializer: Materializer,
        coordinators: CoordinatorFactory,
        page_size: int,
        max_running: int | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError("page_size must be positive")
        self._max_running = max_running
        self._candidates = candidates
        self._materializer = materializer
        self._coordinators = coordinators
        self._page_size = page_size
        self._cursor: str | None = None
        self._cursor_lock = threading.Lock()  # passes may overlap; cursor and hints are shared
        # Attempts a pass of this process is handling now. Only a hint to spare overlapping
        # passes the same materialization: uniqueness still comes from the database CAS.
        self._in_hand: set[str] = set()

    def run_pass(self) -> PassResult:
        """One page of candidates; stops after the first candidate the launcher was called for."""
        # At capacity nothing may start: one count, no page, the resume cursor kept.
        if self._max_running is not None and self._candidates.active_count() >= self._max_running:
            return PassResult(outcomes=(), truncated=False, at_capacity=True)
        with self._cursor_lock:
            cursor = self._cursor
        page = self._candidates.dispatch_candidates(limit=self._page_size, cursor=cursor)
        outcomes: list[CandidateOutcome] = []
        stop = False
        # (task, revision) found at max_concurrent in this pass: their other candidates in
        # the page are passed over without a query, an event or a write.
        blocked: set[tuple[str, int]] = set()
        more_in_page = False
        listed_now = True  # nothing of this pass has run since the page was read
        for index, candidate in enumerate(page.items):
            if (candidate.task, candidate.revision) in blocked:
                continue
            # A source that knows no hold (a test's fake) lists no held candidate.
            if getattr(candidate, "held", False):
                held = CandidateOutcome(candidate.run_id, candidate.attempt_id, kind="held")
                outcomes.append(held)
                continue
            if not self._take(candidate.attempt_id):
                continue
            try:
                outcome, stop = self._one(candidate, listed_now=listed_now)
                listed_now = False
            finally:
                with self._cursor_lock:
                    self._in_hand.discard(candidate.attempt_id)
            outcomes.append(outcome)
            if outcome.kind == "task_at_capacity":
                blocked.add((candidate.task, candidate.revision))
            if stop:
                more_in_page = index + 1 < len(page.items)
                break
        truncated = page.next_cursor is not None
        at_capacity = bool(outcomes) and outcomes[-1].kind == "at_capacity"
        with self._cursor_lock:
            # Resume past a page that yielded nothing; start from the top after any launch,
            # after a stop, or when the end of the queue was reached.
            self._cursor = page.next_cursor if truncated and not stop else None
        return PassResult(
            outcomes=tuple(outcomes),
            truncated=truncated,
            at_capacity=at_capacity,
            more_in_page=more_in_page,
        )

    def _take(self, attempt_id: str) -> bool:
        """Claim the hint for ``attempt_id``; False when another pass here already has it."""
        with self._cursor_lock:
            if attempt_id in self._in_hand:
                return False
            self._in_hand.add(attempt_id)
            return True

    def _one(
        self, candidate: DispatchCandidateLike, *, listed_now: bool = False
    ) -> tuple[CandidateOutcome, bool]:
        """The outcome, and whether the pass must stop after it."""
        ids: _Ids = {"run_id": candidate.run_id, "attempt_id": candidate.attempt_id}
        try:
            command = self._materializer.materialize(candidate, listed_now=listed_now)
        except _RACES:
            return CandidateOutcome(**ids, kind="skipped_race"), False
        except AdmissionRefused as exc:
            # The task budget or the disk, pre-checked here; the run stays queued, untouched.
            # A low disk stops the pass: every other candidate would meet it too.
            if exc.scope == "disk":
                return CandidateOutcome(**ids, kind="disk_low"), True
            return CandidateOutcome(**ids, kind="task_at_capacity"), False
        except RunFailedBeforeStart as exc:
            kind: OutcomeKind = "failed_before_start"
            return CandidateOutcome(**ids, kind=kind, error_code=exc.code.value), False
        except ArtifactRefused as exc:
            # An unsafe root or shard stops the pass: every other candidate would hit it too.
            outcome = CandidateOutcome(**ids, kind="artifact_refused", reason=exc.reason)
            return outcome, not exc.per_candidate
        except (KeyUnavailable, StorageUnavailable) as exc:
            # The key ring or the database fails every candidate alike: the run stays queued
            # and the pass stops until the operator (or the disk) fixes it.
            return CandidateOutcome(**ids, kind="error", reason=type(exc).__name__), True
        except Exception as exc:
            # Last resort, on purpose: a bug or an untranslated driver error in one candidate
            # must end this pass with a content-free outcome, never the dispatch loop.
            return CandidateOutcome(**ids, kind="error", reason=type(exc).__name__), True
        # At most one launch per pass (docs/design.md §3.3), whatever its outcome; a task
        # budget T1 refused, or a T1 that lost a race (the candidate changed since its page
        # was read), launched nothing, so the pass goes on.
        outcome = self._start(candidate, command)
        return outcome, outcome.kind not in _WAITING and outcome.kind != "skipped_race"

    def _start(self, candidate: DispatchCandidateLike, command: StartCommand) -> CandidateOutcome:
        ids: _Ids = {"run_id": candidate.run_id, "attempt_id": candidate.attempt_id}
        try:
            result = self._coordinators().start(command)
        except Exception as exc:
            # T1 did not take (a race, or the database refused; broad on purpose, since any
            # error out of T1 means the launcher was never called): no shim exists for this
            # attempt, so the empty log we created is removed.
            self._materializer.discard_artifact(command)
            if isinstance(exc, AdmissionRefused):
                kind: OutcomeKind = _REFUSED.get(exc.scope, "task_at_capacity")
                return CandidateOutcome(**ids, kind=kind)
            if isinstance(exc, (*_RACES, NotFound)):
                return CandidateOutcome(**ids, kind="skipped_race")
            return CandidateOutcome(**ids, kind="error", reason=type(exc).__name__)
        finally:
            del command  # the frozen environment (with secrets) ends with this call
        return _outcome(result)


def _outcome(result: StartResult) -> CandidateOutcome:
    kind: OutcomeKind = "started" if result.status == "running" else result.status
    run = result.run
    waited = None
    # ``ended`` started too: the job ran and its ending was recorded before T2 committed.
    if kind in ("started", "ended") and run is not None and run.started_at_ms is not None:
        waited = max(0, run.started_at_ms - run.created_at_ms)
    elif kind == "started":
        waited = result.waited_ms  # T2 committed by the worker: the run was not read back
    return CandidateOutcome(
        run_id=result.run_id,
        attempt_id=result.attempt_id,
        kind=kind,
        error_code=result.error_code.value if result.error_code is not None else None,
        reason=result.reason,
        created_to_started_ms=waited,
    )


def build_dispatcher(
    *,
    candidates: CandidateSource,
    definitions: DefinitionSource,
    secrets: SecretSource,
    transitions: RunTransitions,
    launcher: Launcher,
    controller: ProcessController,
    settings_like: SettingsLike,
    disk: DiskProbe | None = None,
    max_running: int | None = None,
    spares: LogSpares | None = None,
) -> Dispatcher:
    """Wire materializer, a coordinator per start, and the dispatcher (for the composition root)."""
    materializer = Materializer(
        candidates=candidates,
        definitions=definitions,
        secrets=secrets,
        transitions=transitions,
        settings=settings_like,
        disk=disk,
        spares=spares,
    )
    profile = settings_like.profile

    def coordinators() -> StartCoordinator:
        return StartCoordinator(
            transitions=transitions,
            launcher=launcher,
            controller=controller,
            stop_grace_s=profile.stop_grace_s,
            runs=candidates,
            max_running=max_running,
        )

    return Dispatcher(
        candidates=candidates,
        materializer=materializer,
        coordinators=coordinators,
        page_size=profile.dispatch_page_size,
        max_running=max_running,
    )
