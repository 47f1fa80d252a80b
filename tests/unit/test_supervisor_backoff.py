"""The supervisor's restart backoff: 0.5 s doubling to 30 s, reset after 60 s of healthy life."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.supervisor.supervisor import BackoffPolicy, next_restart


def test_delays_double_from_half_a_second_up_to_the_cap() -> None:
    failures, delays = 0, []
    for _ in range(9):
        failures, delay = next_restart(failures, lived_s=1.0)
        delays.append(delay)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert failures == 9


def test_a_healthy_life_resets_the_count() -> None:
    assert next_restart(7, lived_s=60.0) == (1, 0.5)
    assert next_restart(7, lived_s=59.9) == (8, 30.0)


def test_a_custom_policy_is_honoured() -> None:
    policy = BackoffPolicy(base_s=1.0, cap_s=5.0, healthy_after_s=10.0)
    assert next_restart(0, 0.0, policy) == (1, 1.0)
    assert next_restart(2, 0.0, policy) == (3, 4.0)
    assert next_restart(3, 0.0, policy) == (4, 5.0)
    assert next_restart(3, 10.0, policy) == (1, 1.0)


@given(st.integers(min_value=-5, max_value=10**6), st.floats(min_value=0, max_value=1e9))
def test_delay_is_always_within_bounds(failures: int, lived_s: float) -> None:
    count, delay = next_restart(failures, lived_s)
    assert count >= 1
    assert 0.5 <= delay <= 30.0
