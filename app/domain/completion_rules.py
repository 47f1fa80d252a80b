"""Whether a process ending may become an attempt's terminal state (docs/design.md §3.12):
the rules the completion transaction applies to the rows it read.

Pure: the storage adapter reads the attempt and its run inside one transaction, asks these
functions, and writes what they decided in the same transaction. In order:

1. the caller: the attempt exists and belongs to the run, runs on this executor, and the
   callback token matches the digest T1 committed (constant-time comparison);
2. an attempt or run that already ended answers ``already_terminal`` (a replay is harmless);
3. the callback sequence must be newer than the one stored, and the attempt must be the
   run's latest: anything else is refused with a stable reason;
4. an attempt still ``starting`` (the job ended before the api's T2 committed) first moves
   to ``running`` with the shim's start time, so the history reads dispatching → running →
   ending and the late T2 is refused;
5. the ending follows the exit status, unless a committed cancel intent names it; times
   never run backwards relative to what is committed.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Protocol

from app.domain.canonical import sha256_digest
from app.domain.states import TERMINAL_ATTEMPT, TERMINAL_RUN, AttemptStatus, ending_for

LOCAL_PROCESS = "local_process"

# Stable reasons of a refused completion (never receipt content).
WRONG_ATTEMPT = "WRONG_ATTEMPT"
WRONG_EXECUTOR = "WRONG_EXECUTOR"
WRONG_TOKEN = "WRONG_TOKEN"
WRONG_SEQUENCE = "WRONG_SEQUENCE"
NOT_LATEST_ATTEMPT = "NOT_LATEST_ATTEMPT"


class AttemptFacts(Protocol):
    """The attempt columns the rules read (an attempts row as the transaction read it)."""

    @property
    def run_id(self) -> str: ...

    @property
    def number(self) -> int: ...

    @property
    def status(self) -> str: ...

    @property
    def executor(self) -> str: ...

    @property
    def callback_token_digest(self) -> str | None: ...

    @property
    def callback_sequence(self) -> int: ...

    @property
    def created_at_ms(self) -> int: ...

    @property
    def started_at_ms(self) -> int | None: ...


class RunFacts(Protocol):
    """The run columns the rules read."""

    @property
    def status(self) -> str: ...

    @property
    def latest_attempt(self) -> int: ...

    @property
    def cancel_reason(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Refused:
    """Write nothing; answer ``rejected`` with this stable reason."""

    reason: str


@dataclass(frozen=True, slots=True)
class AlreadyEnded:
    """Write nothing (but a receipt may be marked consumed); answer ``already_terminal``."""

    run_status: str


@dataclass(frozen=True, slots=True)
class Accepted:
    """Write the ending. ``catch_up_started_at_ms``: first move the attempt (and run) from
    starting/dispatching to running with this start time, in the same transaction."""

    ending: AttemptStatus
    exit_code: int | None  # None when a signal ended the process
    signal: int | None
    finished_at_ms: int
    catch_up_started_at_ms: int | None = None


CompletionDecision = Refused | AlreadyEnded | Accepted


def refuse_caller(attempt: AttemptFacts | None, *, run_id: str, token: str) -> Refused | None:
    """Rule 1: None when the caller may report this attempt's ending, else the refusal."""
    if attempt is None or attempt.run_id != run_id:
        return Refused(WRONG_ATTEMPT)
    if attempt.executor != LOCAL_PROCESS:
        return Refused(WRONG_EXECUTOR)
    stored = attempt.callback_token_digest
    if stored is None or not hmac.compare_digest(
        stored.encode(), sha256_digest(token.encode("utf-8")).encode()
    ):
        return Refused(WRONG_TOKEN)
    return None


def decide_completion(
    attempt: AttemptFacts,
    run: RunFacts,
    *,
    callback_sequence: int,
    exit_code: int,
    signal: int | None,
    finished_at_ms: int,
    started_at_ms: int | None = None,
) -> CompletionDecision:
    """Rules 2-5 for a caller ``refuse_caller`` let through."""
    if attempt.status in TERMINAL_ATTEMPT or run.status in TERMINAL_RUN:
        return AlreadyEnded(run.status)
    if callback_sequence <= attempt.callback_sequence:
        return Refused(WRONG_SEQUENCE)
    if run.latest_attempt != attempt.number:
        return Refused(NOT_LATEST_ATTEMPT)
    catch_up = None
    floor = attempt.started_at_ms or attempt.created_at_ms
    if attempt.status == AttemptStatus.STARTING:
        # The shim's own start time, but never before T1 created the attempt.
        catch_up = max(started_at_ms or attempt.created_at_ms, attempt.created_at_ms)
        floor = catch_up
    return Accepted(
        ending=ending_for(exit_code=exit_code, signal=signal, cancel_reason=run.cancel_reason),
        exit_code=None if signal is not None else exit_code,
        signal=signal,
        finished_at_ms=max(finished_at_ms, floor),
        catch_up_started_at_ms=catch_up,
    )
