"""QL_MAX_RUNNING and QL_MAX_QUEUED (docs/concurrency-budgets.md §1): defaults, overrides, errors."""

from __future__ import annotations

import pytest

from app.settings import MAX_QUEUED, Settings


@pytest.mark.parametrize(("profile", "running"), [("edge", 2), ("standalone", 8)])
def test_the_running_budget_defaults_to_the_profile(profile: str, running: int) -> None:
    settings = Settings.from_env({"QL_PROFILE": profile})
    assert settings.max_running == running
    assert settings.max_queued == MAX_QUEUED == 10_000


def test_the_budget_variables_override_the_profile() -> None:
    env = {"QL_PROFILE": "edge", "QL_MAX_RUNNING": "5", "QL_MAX_QUEUED": "3"}
    settings = Settings.from_env(env)
    assert (settings.max_running, settings.max_queued) == (5, 3)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("QL_MAX_RUNNING", "0", "QL_MAX_RUNNING must be at least 1, not 0"),
        ("QL_MAX_RUNNING", "two", "QL_MAX_RUNNING must be a whole number, not 'two'"),
        ("QL_MAX_RUNNING", "100000", "QL_MAX_RUNNING must be at most 10000, not 100000"),
        ("QL_MAX_QUEUED", "-1", "QL_MAX_QUEUED must be at least 1, not -1"),
        ("QL_MAX_QUEUED", "1e4", "QL_MAX_QUEUED must be a whole number, not '1e4'"),
    ],
)
def test_a_bad_budget_value_is_a_clear_start_up_error(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Settings.from_env({name: value})
    assert str(caught.value) == message
