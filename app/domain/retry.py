"""Retries as new attempts (docs/retries.md): the policy a revision carries and the one
decision every ending goes through. Pure: no clock, no random source, no I/O; the storage
adapter passes the ending's time and a uniform draw, and writes what this decided in the
transaction that records the ending.

An attempt that ends with a status in the policy's ``on``, before ``max_attempts``, with no
cancel intent but its own deadline's, gets a successor ``claimed`` attempt that may not
start before ``not_before_ms``. ``lost`` counts only when the ending's code proves the
previous attempt's processes are gone: a retry must never run beside a job that may live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.domain.errors import ErrorCode, ValidationFailed
from app.domain.states import AttemptStatus

MAX_ATTEMPTS_MIN = 1
MAX_ATTEMPTS_MAX = 20
MAX_DELAY_S = 86_400.0  # a day: any longer wait is a schedule, not a retry
FACTOR_MIN = 1.0
FACTOR_MAX = 10.0
RETRY_ON = (AttemptStatus.FAILED.value, AttemptStatus.LOST.value, AttemptStatus.TIMED_OUT.value)
_KEYS = frozenset(
    {"max_attempts", "initial_delay_seconds", "factor", "max_delay_seconds", "jitter", "on"}
)

# ``lost`` codes that prove the attempt's processes are gone (docs/retries.md §3):
# the reconciler saw the shim exit and the job gone or stopped by identity
# (app/execution/reconciler.py step 3), or stopped the exact identity after an interrupted
# start (step 4), or the coordinator stopped it after T2 failed (docs/design.md §3.8).
# RECOVERY_IDENTITY_UNSUPPORTED is the unknown case (nothing could be verified or signalled):
# never retried.
LOST_PROVEN_GONE = frozenset(
    {
        ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT.value,
        ErrorCode.RECOVERY_START_INTERRUPTED.value,
        ErrorCode.POST_SPAWN_PERSIST_FAILED.value,
    }
)
# Endings no retry follows whatever ``on`` says: a start that found no executor is requeued
# (docs/backlog-requeue.md) and ends only after MAX_UNAVAILABLE_ATTEMPTS of them in a row.
NEVER_RETRIED = frozenset({ErrorCode.EXECUTOR_UNAVAILABLE.value})
# The only cancel intent a retry may follow: the ended attempt's own deadline.
_OWN_DEADLINE = "timeout"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A revision's ``retry``; the defaults are no retry at all (``max_attempts`` 1)."""

    max_attempts: int = 1
    initial_delay_seconds: float = 10.0
    factor: float = 2.0
    max_delay_seconds: float = 600.0
    jitter: bool = False
    on: tuple[str, ...] = (AttemptStatus.FAILED.value,)

    def body(self) -> dict[str, Any]:
        """The canonical stored form (numbers normalized, ``on`` sorted)."""
        return {
            "max_attempts": self.max_attempts,
            "initial_delay_seconds": _number(self.initial_delay_seconds),
            "factor": _number(self.factor),
            "max_delay_seconds": _number(self.max_delay_seconds),
            "jitter": self.jitter,
            "on": sorted(self.on),
        }

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RetryPolicy:
        """The policy of a stored body (already validated when it was stored)."""
        return cls(
            max_attempts=int(body["max_attempts"]),
            initial_delay_seconds=float(body["initial_delay_seconds"]),
            factor=float(body["factor"]),
            max_delay_seconds=float(body["max_delay_seconds"]),
            jitter=bool(body["jitter"]),
            on=tuple(body["on"]),
        )


def _number(value: float) -> int | float:
    # 10 and 10.0 are the same policy and must have the same digest.
    return int(value) if float(value).is_integer() else float(value)


def _bad(detail: str) -> ValidationFailed:
    return ValidationFailed(ErrorCode.INVALID_RETRY_POLICY, f"retry: {detail}")


def _seconds(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"{key} must be a number of seconds")
    if not 0 <= value <= MAX_DELAY_S:  # also refuses NaN
        raise _bad(f"{key} must be 0..{int(MAX_DELAY_S)}")
    return float(value)


def validate_retry(body: dict[str, Any] | None) -> RetryPolicy | None:
    """Check a revision's ``retry`` object; None when absent. ValidationFailed
    INVALID_RETRY_POLICY (422) names the first field at fault."""
    if body is None:
        return None
    if not isinstance(body, dict):
        raise _bad("must be an object")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise _bad(f"unknown field {unknown[0]}")
    default = RetryPolicy()
    attempts = body.get("max_attempts", default.max_attempts)
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        raise _bad("max_attempts must be an integer")
    if not MAX_ATTEMPTS_MIN <= attempts <= MAX_ATTEMPTS_MAX:
        raise _bad(f"max_attempts must be {MAX_ATTEMPTS_MIN}..{MAX_ATTEMPTS_MAX}")
    initial = _seconds(body, "initial_delay_seconds", default.initial_delay_seconds)
    cap = _seconds(body, "max_delay_seconds", max(default.max_delay_seconds, initial))
    if cap < initial:
        raise _bad("max_delay_seconds must be at least initial_delay_seconds")
    factor = body.get("factor", default.factor)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise _bad("factor must be a number")
    if not FACTOR_MIN <= factor <= FACTOR_MAX:
        raise _bad(f"factor must be {FACTOR_MIN:g}..{FACTOR_MAX:g}")
    jitter = body.get("jitter", default.jitter)
    if not isinstance(jitter, bool):
        raise _bad("jitter must be true or false")
    on = body.get("on", list(default.on))
    if not isinstance(on, list) or not on:
        raise _bad("on must be a non-empty list of failed, timed_out, lost")
    for status in on:
        if status not in RETRY_ON:
            raise _bad("on may name only failed, timed_out, lost")
    if len(set(on)) != len(on):
        raise _bad("on names a status twice")
    return RetryPolicy(
        max_attempts=attempts,
        initial_delay_seconds=initial,
        factor=float(factor),
        max_delay_seconds=cap,
        jitter=jitter,
        on=tuple(sorted(on)),
    )


def retry_delay_ms(policy: RetryPolicy, *, attempt: int, draw: float) -> int:
    """The wait after attempt ``attempt`` (1-based) ended: ``initial * factor^(attempt-1)``,
    capped at ``max_delay_seconds``; with ``jitter`` a uniform point of its upper half,
    ``draw`` in [0, 1) picking it (so the wait never falls below half the backoff)."""
    base = policy.initial_delay_seconds * policy.factor ** min(attempt - 1, MAX_ATTEMPTS_MAX)
    delay = min(base, policy.max_delay_seconds)
    if policy.jitter:
        delay = delay / 2 + delay / 2 * min(max(draw, 0.0), 1.0)
    return round(delay * 1000)


def retry_not_before_ms(
    policy: RetryPolicy | None,
    *,
    attempt: int,
    ending: str,
    error_code: str | None,
    cancel_reason: str | None,
    ended_at_ms: int,
    draw: float,
) -> int | None:
    """When attempt ``attempt`` (counted as the policy counts, 1-based) ending ``ending``
    gets a successor: the instant it may start; None when the run ends with this attempt."""
    if policy is None or attempt >= policy.max_attempts or ending not in policy.on:
        return None
    if cancel_reason is not None and cancel_reason != _OWN_DEADLINE:
        return None  # a user's cancel, a replace or a deleted schedule: the run ends
    if error_code in NEVER_RETRIED:
        return None
    if ending == AttemptStatus.LOST.value and error_code not in LOST_PROVEN_GONE:
        return None  # the outcome is unknown: a retry could run beside the old job
    return ended_at_ms + retry_delay_ms(policy, attempt=attempt, draw=draw)
