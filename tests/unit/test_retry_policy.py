"""The retry rule (app/domain/retry.py), pure: the delay sequences, the cap, the jitter band,
and which endings get a successor attempt (docs/retries.md).

tests/storage/test_retries.py checks the same rule through the real transaction on both
engines; these check the arithmetic and every refusal fast.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.domain.errors import ErrorCode, ValidationFailed
from app.domain.model import Attempt, Run, revision_body
from app.domain.retry import RetryPolicy, retry_delay_ms, retry_not_before_ms, validate_retry

BASE = {"executor": "local_process", "argv": ["/bin/true"], "cwd": None, "recipe": None,
        "timeout_seconds": None, "priority": 0}  # fmt: skip


def _delays(policy: RetryPolicy, draw: float = 0.0) -> list[int]:
    return [retry_delay_ms(policy, attempt=n, draw=draw) for n in range(1, policy.max_attempts)]


def test_exponential_delays_are_capped_and_deterministic_without_jitter() -> None:
    policy = validate_retry(
        {"max_attempts": 8, "initial_delay_seconds": 10, "factor": 2.0, "max_delay_seconds": 300}
    )
    assert policy is not None
    assert _delays(policy) == [10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000]
    assert _delays(policy, draw=0.99) == _delays(policy)  # no jitter: the draw is ignored
    constant = RetryPolicy(max_attempts=4, initial_delay_seconds=0.25, factor=1.0)
    assert _delays(constant) == [250, 250, 250]


def test_jitter_stays_in_the_upper_half_of_each_backoff() -> None:
    policy = RetryPolicy(max_attempts=5, initial_delay_seconds=10, factor=3.0,
                         max_delay_seconds=60, jitter=True)  # fmt: skip
    assert _delays(policy, draw=0.0) == [5_000, 15_000, 30_000, 30_000]
    assert _delays(policy, draw=0.5) == [7_500, 22_500, 45_000, 45_000]
    assert _delays(policy, draw=0.999999) == [10_000, 30_000, 60_000, 60_000]


@pytest.mark.parametrize(
    ("ending", "code", "cancel", "retried"),
    [
        ("failed", None, None, True),
        ("failed", "EXECUTOR_START_FAILED", None, True),
        ("timed_out", None, "timeout", True),  # its own deadline's intent
        ("failed", None, "user", False),
        ("cancelled", None, "user", False),
        ("succeeded", None, None, False),
        ("lost", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT", None, True),  # proven gone
        ("lost", "RECOVERY_START_INTERRUPTED", None, True),  # stopped by identity
        ("lost", "POST_SPAWN_PERSIST_FAILED", None, True),
        ("lost", "RECOVERY_IDENTITY_UNSUPPORTED", None, False),  # unknown: never
        ("lost", None, None, False),
        ("failed", "EXECUTOR_UNAVAILABLE", None, False),  # the requeue's own bound
    ],
)
def test_which_endings_get_a_successor(
    ending: str, code: str | None, cancel: str | None, retried: bool
) -> None:
    policy = RetryPolicy(max_attempts=3, initial_delay_seconds=1,
                         on=("failed", "lost", "timed_out"))  # fmt: skip
    at = retry_not_before_ms(policy, attempt=1, ending=ending, error_code=code,
                             cancel_reason=cancel, ended_at_ms=1_000, draw=0.0)  # fmt: skip
    assert at == (2_000 if retried else None)


def test_the_last_attempt_and_statuses_outside_on_end_the_run() -> None:
    policy = RetryPolicy(max_attempts=3, initial_delay_seconds=1)
    kwargs = {"error_code": None, "cancel_reason": None, "ended_at_ms": 0, "draw": 0.0}
    assert retry_not_before_ms(policy, attempt=2, ending="failed", **kwargs) == 2_000
    assert retry_not_before_ms(policy, attempt=3, ending="failed", **kwargs) is None
    assert retry_not_before_ms(policy, attempt=1, ending="timed_out", **kwargs) is None
    assert retry_not_before_ms(None, attempt=1, ending="failed", **kwargs) is None


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"max_attempts": 0}, "max_attempts must be 1..20"),
        ({"max_attempts": 21}, "max_attempts must be 1..20"),
        ({"max_attempts": True}, "max_attempts must be an integer"),
        ({"initial_delay_seconds": -1}, "initial_delay_seconds must be 0..86400"),
        ({"initial_delay_seconds": 20, "max_delay_seconds": 10}, "at least initial"),
        ({"factor": 0.5}, "factor must be 1..10"),
        ({"jitter": 1}, "jitter must be true or false"),
        ({"on": []}, "on must be a non-empty list"),
        ({"on": ["succeeded"]}, "on may name only"),
        ({"on": ["failed", "failed"]}, "twice"),
        ({"tries": 3}, "unknown field tries"),
    ],
)
def test_a_bad_policy_is_refused_with_its_field(body: dict[str, object], detail: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        validate_retry(body)
    assert caught.value.code is ErrorCode.INVALID_RETRY_POLICY
    assert detail in caught.value.detail


def test_a_revision_without_retry_keeps_its_digest_body_and_equal_policies_agree() -> None:
    assert revision_body(**BASE) == BASE  # what revisions stored before retries digested
    one = validate_retry({"max_attempts": 3, "initial_delay_seconds": 10, "on": ["lost", "failed"]})
    two = validate_retry({"max_attempts": 3, "initial_delay_seconds": 10.0, "factor": 2,
                          "on": ["failed", "lost"]})  # fmt: skip
    assert one is not None and two is not None
    assert revision_body(**BASE, retry=one) == revision_body(**BASE, retry=two)
    assert revision_body(**BASE, retry=one)["retry"] == {
        "max_attempts": 3, "initial_delay_seconds": 10, "factor": 2, "max_delay_seconds": 600,
        "jitter": False, "on": ["failed", "lost"],
    }  # fmt: skip
    assert RetryPolicy.from_body(one.body()) == one


@pytest.mark.parametrize(
    ("status", "not_before_ms", "waits"),
    [
        ("claimed", 2_000, True),  # a retry whose time is still to come
        ("claimed", 1_000, False),  # due now: it starts at the next pass
        ("claimed", None, False),
        ("running", 2_000, False),  # only a claimed attempt waits in the queue
    ],
)
def test_a_run_says_whether_its_retry_waits_for_its_time(
    status: str, not_before_ms: int | None, waits: bool
) -> None:
    """The one rule a queued run's GET and ``waiting`` read (a retry waiting for its time is
    answered from the run alone, with no read of what else holds it back)."""
    attempt = Attempt(
        id="a", run_id="r", number=2, status=status, executor="local_process",
        created_at_ms=0, started_at_ms=None, finished_at_ms=None, exit_code=None, signal=None,
        error_code=None, deadline_at_ms=None, log_artifact_id=None, callback_sequence=0,
        not_before_ms=not_before_ms,
    )  # fmt: skip
    run = Run(
        id="r", task="t", revision=1, status="queued", priority=0, version=1, created_at_ms=0,
        started_at_ms=None, finished_at_ms=None, cancel=None, latest_attempt=attempt,
    )  # fmt: skip
    assert run.retry_waits(1_000) is waits
    assert replace(run, latest_attempt=None).retry_waits(0) is False  # a first attempt
