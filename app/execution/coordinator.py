"""One-shot start coordinator: T1, launch, T2, and the compensations of docs/design.md §3.8.

The plaintext callback token exists only on this call stack and in the launch request handed
to the worker; the database holds its SHA-256 digest. No result or exception carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.domain.canonical import sha256_digest
from app.domain.errors import ErrorCode
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle, Run, plausible_handle
from app.domain.states import is_terminal_run
from app.domain.tokens import new_callback_token
from app.execution.materializer import StartCommand
from app.execution.ports import (
    Launched,
    Launcher,
    LaunchFailed,
    LaunchOutcomeUnknown,
    LaunchRejected,
    LaunchUnavailable,
    ProcessController,
    RecordingLauncher,
    RunLookup,
    RunTransitions,
)

# The reason of an ``unresolved`` start whose launch may or may not have spawned.
LAUNCH_OUTCOME_UNKNOWN = "LAUNCH_OUTCOME_UNKNOWN"
StartStatus = Literal["running", "start_failed", "lost", "ended", "unresolved", "requeued"]


@dataclass(frozen=True, slots=True)
class StartResult:
    """How one start ended. ``unresolved`` leaves dispatching/starting for the reconciler.

    ``ended``: T2 lost the race to the job's own ending (a very fast job whose receipt was
    applied from ``starting``), or a cancel intent ended a start that found no executor;
    ``run`` holds that committed terminal state. ``requeued``: nothing was spawned, the run
    is queued again with a fresh attempt (error_code EXECUTOR_UNAVAILABLE).
    """

    status: StartStatus
    run_id: str
    attempt_id: str
    error_code: ErrorCode | None = None
    reason: str | None = None  # stable and content-free (a launcher reason or stop result)
    run: Run | None = None  # the committed aggregate, when this call knows it
    # created→started of a start whose T2 the worker committed (``run`` is then not read).
    waited_ms: int | None = None


class StartCoordinator:
    """Starts one command; a second use of the same object is refused (docs/design.md §3.7)."""

    def __init__(
        self,
        *,
        transitions: RunTransitions,
        launcher: Launcher,
        controller: ProcessController,
        stop_grace_s: float,
        runs: RunLookup | None = None,
        max_running: int | None = None,
    ) -> None:
        self._transitions = transitions
        self._max_running = max_running
        self._runs = runs
        self._launcher = launcher
        self._controller = controller
        self._stop_grace_s = stop_grace_s
        self._used = False

    def start(self, command: StartCommand) -> StartResult:
        """T1 then launch then T2; T1 errors propagate and the launcher is never called."""
        if self._used:
            raise RuntimeError("a start coordinator is one-shot")
        self._used = True
        token = new_callback_token()
        # docs/design.md §3.7: authority (digest, deadline, log) is committed before any spawn.
        dispatched = self._transitions.begin_dispatch(
            run_id=command.run_id,
            attempt_id=command.attempt_id,
            expected_version=command.expected_version,
            token_digest=sha256_digest(token.encode("utf-8")),
            deadline_at_ms=command.deadline_at_ms,
            log_artifact_id=command.log_artifact_id,
            max_running=self._max_running,
            max_concurrent=command.max_concurrent,
        )
        try:
            launched = self._launch(command, token)
        except LaunchRejected as exc:
            # The worker already journaled (or recovery fenced) this attempt: a process may
            # exist, or recovery is requeueing the run; either way the ending is not ours to
            # record, so there is never a second one (the reason says which).
            return _result("unresolved", command, reason=exc.reason)
        except LaunchUnavailable as exc:
            return self._requeue(command, exc.reason)
        except LaunchFailed as exc:
            return self._start_failed(command, exc.reason, exc.errno_name)
        except LaunchOutcomeUnknown:
            # Unknown whether the worker spawned (it journals first): never guess an ending;
            # the reconciler decides from the journal (docs/design.md §3.8, fail closed).
            return _result("unresolved", command, reason=LAUNCH_OUTCOME_UNKNOWN)
        except Exception:
            # Last resort, on purpose: a launcher bug or an error it did not translate leaves
            # the outcome just as unknown, and T1 is committed, so this call must still answer
            # rather than leave the start to an exception nobody can act on.
            return _result("unresolved", command, reason=LAUNCH_OUTCOME_UNKNOWN)
        finally:
            del token
        handle = launched.handle
        if not plausible_handle(handle):
            # A handle we cannot trust can never be stopped by identity: leave it to recovery.
            return _result("unresolved", command, reason="INVALID_HANDLE")
        started_at_ms = launched.started_at_ms
        if launched.running:
            # The worker committed T2 with its spawn record: nothing is left to write here.
            # As T2 stores it: a retry's run keeps its first start (docs/retries.md §2).
            began = dispatched.started_at_ms or started_at_ms
            waited = None if began is None else max(0, began - dispatched.created_at_ms)
            return _result("running", command, waited_ms=waited)
        try:
            run = self._transitions.record_running(
                run_id=command.run_id,
                attempt_id=command.attempt_id,
                handle=handle,
                started_at_ms=started_at_ms or now_ms(),
            )
        except Exception:
            # Broad on purpose: a process was spawned, so whatever kept T2 from committing (a
            # refusal, a lost CAS, the database) it must be stopped or left to recovery.
            ended = self._terminal_run(command.run_id)
            if ended is not None:
                # The job ended before T2 and the completion service already recorded its
                # whole history (running, then the ending): nothing is left to stop.
                return _result("ended", command, run=ended)
            running = self._running_run(command)
            if running is not None:
                # T2 is already committed, by the worker: a repeated launch request (the
                # connection broke after the first) is answered from the journal without
                # ``running``. The job is healthy; stopping it would fake a failure.
                return _result("running", command, run=running)
            return self._compensate_after_spawn(command, handle)
        return _result("running", command, run=run)

    def _launch(self, command: StartCommand, token: str) -> Launched:
        request = command.launch_request(token)
        if isinstance(self._launcher, RecordingLauncher):
            return self._launcher.launch_recording(request)
        return Launched(self._launcher.launch(request), None)

    def _start_failed(
        self, command: StartCommand, reason: str, errno_name: str | None = None
    ) -> StartResult:
        # docs/design.md §3.8: no handle, so the launcher already stopped anything it spawned.
        # The launch's reason (and errno) go on the attempt's ending event: without them a
        # program that is not there and a working directory that is not there look the same.
        code = ErrorCode.EXECUTOR_START_FAILED
        detail = {"start_failure": reason} | ({"errno": errno_name} if errno_name else {})
        try:
            run = self._transitions.fail_attempt(
                run_id=command.run_id, attempt_id=command.attempt_id, error_code=code,
                detail=detail,
            )  # fmt: skip
        except Exception:
            # Broad on purpose: the attempt stays starting, which recovery settles anyway.
            return _result("unresolved", command, error_code=code, reason=reason)
        return _result("start_failed", command, error_code=code, reason=reason, run=run)

    def _requeue(self, command: StartCommand, reason: str) -> StartResult:
        # Provably nothing spawned (never delivered, or refused before the journal): the run
        # is not failed for it; it waits in the queue for the worker (docs/backlog-requeue.md).
        code = ErrorCode.EXECUTOR_UNAVAILABLE
        try:
            run = self._transitions.requeue_unspawned(
                run_id=command.run_id, attempt_id=command.attempt_id
            )
        except Exception:
            # Broad on purpose: still starting with no journal entry, whatever the cause;
            # recovery fences it and requeues the run.
            return _result("unresolved", command, error_code=code, reason=reason)
        status: StartStatus = "requeued"
        if run.status == "failed":
            status = "start_failed"  # the MAX_UNAVAILABLE_ATTEMPTS-th start in a row
        elif is_terminal_run(run.status):
            status = "ended"  # a cancel intent was waiting: the user's ending stands
        return _result(status, command, error_code=code, reason=reason, run=run)

    def _compensate_after_spawn(self, command: StartCommand, handle: ProcessHandle) -> StartResult:
        # docs/design.md §3.8: stop the exact identity first; never mark lost on a guess.
        code = ErrorCode.POST_SPAWN_PERSIST_FAILED
        try:
            stopped = self._controller.stop(handle, grace_seconds=self._stop_grace_s)
        except Exception:
            stopped = "unknown"  # the port answers "unknown" itself; a bug must not differ
        if stopped not in ("stopped", "already_exited"):
            return _result("unresolved", command, error_code=code, reason=stopped)
        try:
            run = self._transitions.fail_attempt(
                run_id=command.run_id, attempt_id=command.attempt_id, error_code=code, lost=True
            )
        except Exception:  # broad on purpose: the stopped job's ending is recovery's then
            ended = self._terminal_run(command.run_id)
            if ended is not None:
                # Not a persist failure after all: the job already finished and its ending
                # was committed from ``starting`` (the stop above found it exited).
                return _result("ended", command, reason=stopped, run=ended)
            # The durable starting fact stays; recovery finishes the job (docs/design.md §3.8).
            return _result("unresolved", command, error_code=code, reason=stopped)
        return _result("lost", command, error_code=code, reason=stopped, run=run)

    def _running_run(self, command: StartCommand) -> Run | None:
        """The run when its latest attempt is this command's and ``running`` (T2 committed)."""
        if self._runs is None:
            return None
        try:
            run = self._runs.get_run(command.run_id)
        except Exception:  # only a hint, as in _terminal_run
            return None
        attempt = run.latest_attempt
        if attempt is None or attempt.id != command.attempt_id or attempt.status != "running":
            return None
        return run

    def _terminal_run(self, run_id: str) -> Run | None:
        if self._runs is None:
            return None
        try:
            run = self._runs.get_run(run_id)
        except Exception:  # only a hint for the caller's compensation: none is "not known"
            return None
        return run if is_terminal_run(run.status) else None


def _result(
    status: StartStatus,
    command: StartCommand,
    *,
    error_code: ErrorCode | None = None,
    reason: str | None = None,
    run: Run | None = None,
    waited_ms: int | None = None,
) -> StartResult:
    return StartResult(
        status, command.run_id, command.attempt_id, error_code, reason, run, waited_ms
    )
