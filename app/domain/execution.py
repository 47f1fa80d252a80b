"""Values that cross the execution boundary between the api side and the worker.

They live in the domain so that both ``app.execution`` (ports, services) and ``app.worker``
(launcher, control socket, client) can use them without importing each other's layer;
``app.execution.ports`` re-exports them under their historical names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from app.domain.model import ProcessHandle

StopResult = Literal["stopped", "already_exited", "unknown"]
# Who holds an attempt's receipt reservation name when recovery tries to take it
# (docs/reserved-launch.md): recovery itself (no shim can start the job any more), a live
# shim, a dead one, no bytes yet, or bytes that name nobody (a receipt being published).
ReservationState = Literal["fenced", "shim_alive", "shim_gone", "empty", "unreadable"]
# What happens to the rest of a job once its main process ended (docs/leftovers.md).
Leftovers = Literal["kill", "keep"]
LEFTOVERS: tuple[Leftovers, ...] = ("kill", "keep")
# fenced: the completing worker's lease epoch is no longer current (docs/several-hosts.md §4):
# nothing was written, and the receipt stays for the worker that holds the lease now.
CompletionStatus = Literal["applied", "already_terminal", "rejected", "fenced"]


@dataclass(frozen=True)
class LaunchRequest:
    """Everything the worker needs to start one attempt. Holds secrets: never log or store it."""

    run_id: str
    attempt_id: str
    callback_sequence: int
    token: str = field(repr=False)
    argv: tuple[str, ...] = field(repr=False)
    cwd: str | None = field(repr=False)
    env: dict[str, str] = field(repr=False)
    log_path: str
    log_quota_bytes: int
    deadline_at_ms: int | None
    leftovers: Leftovers = "kill"
    # The revision's ``run_as`` (a name from QL_JOB_USERS); None: the worker's default job
    # user, or the service's own user when none is configured (docs/job-user.md).
    run_as: str | None = None

    def wire_fields(self) -> dict[str, Any]:
        """Plain JSON-able fields shared by the worker socket request and the shim spec
        (``run_as`` only when set; the launcher turns it into the spec's ``job``)."""
        fields: dict[str, Any] = {
            "run_id": self.run_id,
            "attempt_id": self.attempt_id,
            "callback_sequence": self.callback_sequence,
            "token": self.token,
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "log_path": self.log_path,
            "log_quota_bytes": self.log_quota_bytes,
            "leftovers": self.leftovers,
        }
        if self.run_as is not None:
            fields["run_as"] = self.run_as
        return fields


@dataclass(frozen=True, slots=True)
class Launched:
    """What a launch answers: the durable handle, the job's start as its shim reported it
    (None when the handle is the one an earlier launch of the attempt journaled), and
    whether the worker committed T2 with the handle (docs/design.md §3.7): then the caller
    writes nothing more for this start."""

    handle: ProcessHandle
    started_at_ms: int | None
    running: bool = False


@dataclass(frozen=True, slots=True)
class CompletionOutcome:
    """Result of feeding one process ending to the completion transaction."""

    status: CompletionStatus
    run_status: str | None = None
    reason: str | None = None  # stable reason when rejected (never receipt content)
    task: str | None = None  # the run's task when applied (the retention kick needs no read)
