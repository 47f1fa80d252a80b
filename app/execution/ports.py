"""Ports of the execution layer: what it needs from storage, secrets and the worker.

The execution layer imports these protocols only; adapters live in ``app.storage`` and
``app.worker`` and are wired together by the composition root in ``app.context``.

Each method says in a ``Raises:`` line what it raises; every name there is defined in
app/domain/errors.py, so the execution layer catches them without importing an adapter.
Every method of a database-backed port may also raise StorageUnavailable (the database
cannot commit now); its line says so as "StorageUnavailable".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from app.domain.errors import (
    ErrorCode,
    LaunchFailed,
    LaunchOutcomeUnknown,
    LaunchRejected,
    LaunchUnavailable,
)
from app.domain.execution import (
    CompletionOutcome,
    Launched,
    LaunchRequest,
    ReservationState,
    StopResult,
)
from app.domain.model import (
    LogInfo,
    ProcessHandle,
    Recipe,
    Run,
    TaskRevision,
)


class Launcher(Protocol):
    """Starts attempts through the worker (journal first, then spawn)."""

    def launch(self, request: LaunchRequest) -> ProcessHandle:
        """Start the attempt and return its durable handle.

        Raises: LaunchUnavailable (provably nothing spawned: the worker was not reached, or
        refused before journaling), LaunchRejected (the attempt is journaled or fenced
        already), LaunchFailed (the spawn failed, nothing left running), LaunchOutcomeUnknown
        (the request may have arrived and no answer came: a process may exist).
        """
        ...


@runtime_checkable
class RecordingLauncher(Protocol):
    """A launcher whose worker may commit T2 itself, with the spawn record (the worker client)."""

    def launch_recording(self, request: LaunchRequest) -> Launched:
        """``Launcher.launch``, answering whether T2 is already committed.

        Raises: LaunchUnavailable, LaunchRejected, LaunchFailed, LaunchOutcomeUnknown (each
        as for ``Launcher.launch``).
        """
        ...


class ProcessController(Protocol):
    """Stops a process group by exact durable identity."""

    def stop(self, handle: ProcessHandle, *, grace_seconds: float) -> StopResult:
        """TERM, bounded grace, identity re-check, KILL; never signal a mismatched identity.

        Raises: nothing by contract; ``unknown`` when it cannot tell (the worker not reached).
        """
        ...


class DefinitionSource(Protocol):
    """Immutable definitions, read-only."""

    def get_revision(self, task: str, revision: int) -> TaskRevision:
        """The task's revision.

        Raises: NotFound (TASK_NOT_FOUND, REVISION_NOT_FOUND), StorageUnavailable.
        """
        ...

    def get_recipe(self, rid: str) -> Recipe:
        """The recipe with id ``rid``.

        Raises: NotFound (RECIPE_NOT_FOUND), StorageUnavailable.
        """
        ...


class SecretSource(Protocol):
    """Decrypts secret values, only inside the materializer's call."""

    def resolve(self, names: frozenset[str]) -> dict[str, str]:
        """Values by name.

        Raises: SecretsMissing (a NotFound naming the missing names), KeyUnavailable (a value does
        not decrypt under the key ring), StorageUnavailable.
        """
        ...


class RunTransitions(Protocol):
    """The run repository operations the coordinator and completion service use."""

    def begin_dispatch(
        self,
        *,
        run_id: str,
        attempt_id: str,
        expected_version: int | None,
        token_digest: str,
        deadline_at_ms: int | None,
        log_artifact_id: str,
        max_running: int | None = None,
        max_concurrent: int | None = None,
        worker_instance_id: str | None = None,
        lease_epoch: int | None = None,
    ) -> Run:
        """T1: run queued→dispatching, attempt claimed→starting with the callback digest,
        admitted atomically against the budgets (docs/concurrency-budgets.md §2), recording
        the worker instance and lease epoch it launches through (docs/several-hosts.md §2).

        Raises: NotFound (no such run, or not its latest attempt), VersionConflict (the run
        is not at ``expected_version``, or a concurrent change won), InvalidTransition (not
        queued/claimed, a cancel intent, or the attempt already armed), AdmissionRefused
        (``global``: ``max_running`` runs are dispatching or running; ``task``:
        ``max_concurrent`` runs of its task are), StorageUnavailable.
        """
        ...

    def record_running(
        self, *, run_id: str, attempt_id: str, handle: ProcessHandle, started_at_ms: int
    ) -> Run:
        """T2: attempt starting→running with its durable handle, run dispatching→running.

        Raises: NotFound, InvalidTransition (the start moved on: e.g. the job's ending was
        already applied from ``starting``), VersionConflict, StorageUnavailable.
        """
        ...

    def fail_attempt(
        self,
        *,
        run_id: str,
        attempt_id: str,
        error_code: ErrorCode,
        lost: bool = False,
        expected_version: int | None = None,
        detail: Mapping[str, str] | None = None,
    ) -> Run:
        """End an attempt as failed (or lost) with a stable code; CAS on ``expected_version``.
        ``detail``: content-free codes added to the attempt's ending event (a failed
        launch's reason and errno name), never a path, argv or value.

        Raises: NotFound, InvalidTransition (the attempt already ended, or its state does
        not allow that ending), VersionConflict, StorageUnavailable.
        """
        ...

    def requeue_unspawned(self, *, run_id: str, attempt_id: str) -> Run:
        """A start that provably spawned nothing: attempt failed EXECUTOR_UNAVAILABLE and the
        run queued again with a fresh claimed attempt, in one transaction (or, with a cancel
        intent or past MAX_UNAVAILABLE_ATTEMPTS, the run's ending instead).

        Raises: NotFound, InvalidTransition or VersionConflict when the start moved on;
        StorageUnavailable.
        """
        ...


class DispatchCandidateLike(Protocol):
    """One queued run with a claimed latest attempt, as the candidate source lists it."""

    @property
    def run_id(self) -> str: ...

    @property
    def attempt_id(self) -> str: ...

    @property
    def attempt_number(self) -> int: ...

    @property
    def version(self) -> int: ...

    @property
    def task(self) -> str: ...

    @property
    def revision(self) -> int: ...


class CandidatePage(Protocol):
    """One keyset page of candidates (``limit + 1`` detects truncation)."""

    @property
    def items(self) -> Sequence[DispatchCandidateLike]: ...

    @property
    def next_cursor(self) -> str | None: ...


class CandidateSource(Protocol):
    """Bounded candidate discovery and the exact re-read of one run (docs/design.md §3.3, §3.4)."""

    def dispatch_candidates(self, *, limit: int, cursor: str | None = None) -> CandidatePage:
        """One page of candidates in dispatch order.

        Raises: ValidationFailed (INVALID_CURSOR: a cursor this source did not issue),
        StorageUnavailable.
        """
        ...

    def get_run(self, run_id: str) -> Run:
        """The run with its latest attempt.

        Raises: NotFound (RUN_NOT_FOUND), StorageUnavailable.
        """
        ...

    def active_count(self, task: str | None = None) -> int:
        """Runs dispatching or running now, of ``task`` when given (a budget pre-check; the
        exact check is T1's).

        Raises: StorageUnavailable.
        """
        ...


class DiskProbe(Protocol):
    """Free space of the filesystem holding a path (statvfs in production)."""

    def free_bytes(self, path: Path) -> int:
        """Bytes available to an unprivileged writer on ``path``'s filesystem (0 when it is
        mounted read-only).

        Raises: OSError (statvfs failed even on the nearest existing ancestor).
        """
        ...


class ReceiptFiles(Protocol):
    """The receipt file store, addressed by attempt id (never by listing a directory)."""

    def read(self, attempt_id: str) -> bytes | None:
        """Bounded bytes of the receipt, None when absent.

        Raises: ReceiptInvalid (NOT_REGULAR: a symlink or not a regular file), OSError.
        """
        ...

    def quarantine(self, attempt_id: str) -> bool:
        """Move the receipt into the private quarantine; True when it is there.

        Raises: OSError (the quarantine directory cannot be written).
        """
        ...

    def remove(self, attempt_id: str) -> None:
        """Delete a consumed receipt and the shim's temp files of it (missing is fine).

        Raises: OSError (other than the file being missing).
        """
        ...


class ReceiptJournal(Protocol):
    """The worker's receipt journal: consumption state per attempt."""

    def mark_consumed(self, *, attempt_id: str) -> bool:
        """Record that the terminal transaction committed for this attempt.

        Raises: StorageUnavailable.
        """
        ...

    def mark_quarantined(self, *, attempt_id: str, reason: str) -> bool:
        """Record (committed) that the attempt's receipt is bad, with a stable reason.

        Raises: StorageUnavailable.
        """
        ...


class LogFactSource(Protocol):
    """Size and truncation of an attempt's log artifact."""

    def log_info(self, attempt_id: str) -> LogInfo | None:
        """None when the attempt has no log file.

        Raises: nothing (an unreadable log counts as none).
        """
        ...


class AttemptCompletions(Protocol):
    """The repository's one completion transaction (docs/design.md §3.12)."""

    def complete_attempt(
        self,
        *,
        run_id: str,
        attempt_id: str,
        token: str,
        callback_sequence: int,
        exit_code: int,
        signal: int | None,
        finished_at_ms: int,
        log: LogInfo | None = None,
        started_at_ms: int | None = None,
        consume_receipt: bool = False,
        leftovers_stopped: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> CompletionOutcome:
        """Apply the ending once; already_terminal or rejected otherwise.

        ``fence``: the completing worker's lease (slot, epoch); ``fenced`` (nothing written)
        when it is no longer current (docs/several-hosts.md §4).

        ``leftovers_stopped``: the receipt's content-free count of processes the shim killed
        after the main process ended; it goes into the attempt's terminal event.

        ``consume_receipt``: on applied or already_terminal, also mark the attempt's
        receipt journal entry consumed, in the same transaction.

        Raises: VersionConflict (a concurrent transition won the CAS; nothing was written),
        StorageUnavailable. A refused ending is an answer (``rejected``), not an exception.
        """
        ...


# -- recovery (docs/design.md §3.13, §3.14) ---------------------------------------------------


class ActiveAttemptView(Protocol):
    """An attempt in starting or running, as the reconciler reads it from the database."""

    @property
    def run_id(self) -> str: ...

    @property
    def attempt_id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def handle(self) -> ProcessHandle | None: ...

    @property
    def handle_invalid(self) -> bool: ...

    @property
    def deadline_at_ms(self) -> int | None: ...

    @property
    def cancel_reason(self) -> str | None: ...

    @property
    def created_at_ms(self) -> int: ...


class ActiveAttemptSource(Protocol):
    """Bounded, keyset-paged reads of active attempts (never a directory listing)."""

    def active_attempts(
        self, *, limit: int, after_id: str | None = None
    ) -> Sequence[ActiveAttemptView]:
        """Starting or running attempts by id after ``after_id``.

        Raises: StorageUnavailable.
        """
        ...

    def stop_candidates(
        self, *, now_ms: int, limit: int, after_id: str | None = None
    ) -> Sequence[ActiveAttemptView]:
        """Active attempts whose deadline passed or whose run has a cancel intent.

        Raises: StorageUnavailable.
        """
        ...

    def active_among(self, attempt_ids: list[str]) -> Mapping[str, ActiveAttemptView]:
        """Those of ``attempt_ids`` still starting or running, by id (one query).

        Raises: StorageUnavailable.
        """
        ...

    def starting_since_ms(self, run_id: str) -> int | None:
        """When the run's latest attempt entered ``starting`` (T1), if it did.

        Raises: StorageUnavailable.
        """
        ...


class JournalEntryView(Protocol):
    """One receipt journal row as recovery needs it."""

    @property
    def attempt_id(self) -> str: ...

    @property
    def run_id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def handle(self) -> ProcessHandle | None: ...

    @property
    def updated_at_ms(self) -> int: ...


class JournalIndex(Protocol):
    """Reads and retention of the worker's receipt journal."""

    def get(self, attempt_id: str) -> JournalEntryView | None:
        """The attempt's entry, if any.

        Raises: StorageUnavailable.
        """
        ...

    def page_by_state(
        self, *, state: str, limit: int, after: tuple[int, str] | None = None
    ) -> Sequence[JournalEntryView]:
        """Entries in ``state`` by (updated_at_ms, attempt_id) after a keyset cursor.

        Raises: ValueError (not a journal state), StorageUnavailable.
        """
        ...

    def mark_consumed(self, *, attempt_id: str) -> bool:
        """Leave the scan set: nothing is left to consume for this attempt.

        Raises: StorageUnavailable.
        """
        ...

    def mark_fenced(self, *, attempt_id: str) -> bool:
        """reserved → fenced, once no shim can start the attempt's job; False if not reserved.

        Raises: StorageUnavailable.
        """
        ...

    def fence(self, *, attempt_id: str, run_id: str) -> JournalEntryView:
        """Commit an entry that refuses every later launch of the attempt; the entry that
        stands afterwards (the fence, or the launch's own if it reserved first).

        Raises: StorageUnavailable.
        """
        ...

    def delete_settled(self, *, attempt_id: str, state: str) -> bool:
        """Remove an entry still in ``state`` (retention); False if it changed meanwhile.

        Raises: ValueError (a state whose entries are never purged), StorageUnavailable.
        """
        ...


class ProcessProbe(Protocol):
    """Liveness of a handle's exact identities (boot id, pid, start ticks; docs/design.md §3.10)."""

    def job_alive(self, handle: ProcessHandle) -> bool:
        """The job (group leader) with exactly this identity is alive now.

        Raises: nothing (an identity it cannot read is not alive).
        """
        ...

    def shim_alive(self, handle: ProcessHandle) -> bool:
        """The shim with exactly this identity is alive now.

        Raises: nothing (an identity it cannot read is not alive).
        """
        ...


class QuarantineFiles(Protocol):
    """Deletion of settled receipts after their retention."""

    def remove_quarantined(self, attempt_id: str) -> None:
        """Delete the attempt's quarantined receipt and shim temp files (missing is fine).

        Raises: OSError (other than the file being missing).
        """
        ...

    def remove(self, attempt_id: str) -> None:
        """Delete a receipt, or shim temp files, a crash left behind (missing is fine).

        Raises: OSError (other than the file being missing).
        """
        ...

    def sync_removed(self, attempt_ids: Sequence[str]) -> None:
        """Put on disk every removal of these attempts' receipts (each directory once).

        Raises: OSError (a directory fsync failed).
        """
        ...


class ReceiptReservations(Protocol):
    """The shim's receipt reservation name, which recovery may take first (a fence file)."""

    def claim_reservation(self, attempt_id: str) -> ReservationState:
        """Take the attempt's reservation name with O_EXCL (``fenced``: no shim can start
        its job any more), or say whose it is (docs/reserved-launch.md).

        Raises: OSError (the receipt directory cannot be written or read).
        """
        ...


class CancelIntents(Protocol):
    """Committing a cancel intent (the worker commits ``timeout``; the api ``user``)."""

    def request_cancel(
        self, *, run_id: str, reason: Literal["user", "timeout"], attempt_id: str | None = None
    ) -> Run:
        """Record the intent once; a queued run is cancelled at once. ``attempt_id`` (a
        timeout): refused (InvalidTransition) unless it is still the run's active attempt.

        Raises: NotFound (RUN_NOT_FOUND), Conflict (RUN_TERMINAL: the run already ended),
        VersionConflict (a concurrent change won the CAS), StorageUnavailable.
        """
        ...


class RunLookup(Protocol):
    """Reading one run back (with its latest attempt)."""

    def get_run(self, run_id: str) -> Run:
        """The run.

        Raises: NotFound (RUN_NOT_FOUND), StorageUnavailable.
        """
        ...


__all__ = [
    "ActiveAttemptSource",
    "ActiveAttemptView",
    "AttemptCompletions",
    "CancelIntents",
    "CandidatePage",
    "CandidateSource",
    "CompletionOutcome",
    "DefinitionSource",
    "DiskProbe",
    "DispatchCandidateLike",
    "JournalEntryView",
    "JournalIndex",
    "LaunchFailed",
    "LaunchOutcomeUnknown",
    "LaunchRejected",
    "LaunchRequest",
    "LaunchUnavailable",
    "Launched",
    "Launcher",
    "LogFactSource",
    "LogInfo",
    "ProcessController",
    "ProcessProbe",
    "QuarantineFiles",
    "ReceiptFiles",
    "ReceiptJournal",
    "RecordingLauncher",
    "RunLookup",
    "RunTransitions",
    "SecretSource",
    "StopResult",
]
