"""The keep set (app/domain/retention.py): which logs expire, which rows go, under which policy.

Pure: runs are built as ``Candidate`` values with UUIDv7-like ordered ids (``r0001`` < ``r0002``),
so "newest" is the largest id, as in the database.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from app.domain.errors import ValidationFailed
from app.domain.profiles import EDGE
from app.domain.retention import (
    DAY_MS,
    LATEST_FAILED,
    LATEST_SUCCEEDED,
    PINNED,
    RECENT,
    UNCONSUMED,
    YOUNG,
    Candidate,
    RetentionPolicy,
    TaskAnchors,
    TaskOverride,
    keep_reasons,
    plan_logs,
    rows_deletable,
)
from app.settings import RetentionSettings, Settings

NOW = 1_000 * DAY_MS
POLICY = RetentionPolicy(keep_runs=2, keep_days=0, keep_rows=5, task_log_bytes=None)


def _runs(n: int, **overrides: object) -> list[Candidate]:
    """``n`` terminal runs, oldest first, one day apart, each with a 100-byte log."""
    out = []
    for i in range(n):
        values: dict[str, object] = {
            "run_id": f"r{i:04d}",
            "attempt_id": f"a{i:04d}",
            "created_at_ms": NOW - (n - i) * DAY_MS,
            "terminal": True,
            "pinned": False,
            "receipt_settled": True,
            "log_present": True,
            "log_bytes": 100,
        }
        values.update(overrides.get(f"r{i:04d}", {}))  # type: ignore[call-overload]
        out.append(Candidate(**values))  # type: ignore[arg-type]
    return out


def _anchors(runs: list[Candidate], keep_runs: int, ok: str | None = None, bad: str | None = None):
    newest = [c.run_id for c in runs][::-1]
    recent_from = newest[keep_runs - 1] if keep_runs and len(newest) >= keep_runs else None
    return TaskAnchors(
        recent_from_id=recent_from,
        has_recent=keep_runs > 0,
        latest_succeeded_id=ok,
        latest_failed_id=bad,
    )


def test_only_the_newest_keep_runs_keep_their_logs() -> None:
    runs = _runs(5)
    plan = plan_logs(runs, _anchors(runs, 2), POLICY, NOW, limit=100)
    assert plan.expire == ["a0000", "a0001", "a0002"]
    assert plan.freed_bytes == 300


def test_the_union_keeps_latest_succeeded_failed_young_and_pinned() -> None:
    runs = _runs(8, r0001={"pinned": True})
    policy = RetentionPolicy(keep_runs=1, keep_days=3, keep_rows=10, task_log_bytes=None)
    anchors = _anchors(runs, 1, ok="r0000", bad="r0002")
    plan = plan_logs(runs, anchors, policy, NOW, limit=100)
    # r0000 latest succeeded, r0001 pinned, r0002 latest failed, r0006 and r0007 younger than
    # 3 days (r0005 is exactly 3 days old: no longer younger), r0007 the newest run.
    assert plan.expire == ["a0003", "a0004", "a0005"]
    assert keep_reasons(runs[0], anchors, policy, NOW) == {LATEST_SUCCEEDED}
    assert keep_reasons(runs[1], anchors, policy, NOW) == {PINNED}
    assert keep_reasons(runs[2], anchors, policy, NOW) == {LATEST_FAILED}
    assert keep_reasons(runs[7], anchors, policy, NOW) == {RECENT, YOUNG}


def test_keep_days_zero_keeps_nothing_by_age_and_keep_runs_zero_keeps_none_by_count() -> None:
    runs = _runs(3, r0002={"created_at_ms": NOW})
    policy = RetentionPolicy(keep_runs=0, keep_days=0, keep_rows=1, task_log_bytes=None)
    plan = plan_logs(runs, _anchors(runs, 0), policy, NOW, limit=100)
    assert plan.expire == ["a0000", "a0001", "a0002"]


def test_fewer_runs_than_keep_runs_keeps_all() -> None:
    runs = _runs(2)
    assert plan_logs(runs, _anchors(runs, 5), POLICY, NOW, limit=100).expire == []


def test_byte_pressure_takes_the_oldest_soft_kept_logs_but_never_the_floor() -> None:
    runs = _runs(6)
    policy = RetentionPolicy(keep_runs=6, keep_days=30, keep_rows=10, task_log_bytes=250)
    anchors = _anchors(runs, 6, ok="r0000", bad="r0001")
    plan = plan_logs(runs, anchors, policy, NOW, over_bytes=350, limit=100)
    # 600 bytes, budget 250: 350 over; r0000/r0001 are the latest succeeded/failed.
    assert plan.expire == ["a0002", "a0003", "a0004", "a0005"]
    assert plan.freed_bytes == 400
    assert "a0000" not in plan.expire and "a0001" not in plan.expire


def test_the_plan_is_bounded_by_its_limit() -> None:
    runs = _runs(50)
    assert len(plan_logs(runs, _anchors(runs, 2), POLICY, NOW, limit=7).expire) == 7


@pytest.mark.parametrize(
    ("policy", "over"),
    [
        (RetentionPolicy(keep_runs=0, keep_days=0, keep_rows=1, task_log_bytes=0), 10**9),
        (RetentionPolicy(keep_runs=3, keep_days=0, keep_rows=4, task_log_bytes=None), 0),
        (RetentionPolicy(keep_runs=100, keep_days=365, keep_rows=200, task_log_bytes=1), 10**9),
    ],
)
def test_pinned_active_and_unconsumed_survive_every_policy(
    policy: RetentionPolicy, over: int
) -> None:
    special = {
        "r0000": {"pinned": True},
        "r0001": {"terminal": False},
        "r0002": {"receipt_settled": False},
    }
    runs = _runs(6, **special)
    for keep in (0, 1, 6):
        anchors = _anchors(runs, keep)
        plan = plan_logs(runs, anchors, policy, NOW, over_bytes=over, limit=100)
        assert not {"a0000", "a0001", "a0002"} & set(plan.expire)
        for c in runs[:3]:
            assert not rows_deletable(c, anchors, policy, NOW, past_rows=True)
    assert UNCONSUMED in keep_reasons(runs[2], _anchors(runs, 0), policy, NOW)


def test_rows_go_only_past_the_row_budget_with_no_log_left() -> None:
    runs = _runs(4, r0000={"log_present": False}, r0001={"log_present": False})
    anchors = _anchors(runs, 1, ok="r0001")
    assert rows_deletable(runs[0], anchors, POLICY, NOW, past_rows=True)
    assert not rows_deletable(runs[0], anchors, POLICY, NOW, past_rows=False)
    assert not rows_deletable(runs[1], anchors, POLICY, NOW, past_rows=True)  # latest succeeded
    assert not rows_deletable(runs[2], anchors, POLICY, NOW, past_rows=True)  # log still there


def test_a_task_override_merges_over_the_global_policy_and_is_validated() -> None:
    merged = TaskOverride(keep_runs=2).over(
        RetentionPolicy(keep_runs=10, keep_days=7, keep_rows=100, task_log_bytes=5)
    )
    assert (merged.keep_runs, merged.keep_days, merged.keep_rows, merged.task_log_bytes) == (
        2,
        7,
        100,
        5,
    )
    # A task that keeps more logs than the global row budget keeps its rows longer.
    assert TaskOverride(keep_runs=500).over(merged).keep_rows == 1001
    for bad in (
        TaskOverride(keep_runs=5, keep_rows=5),
        TaskOverride(keep_days=-1),
        TaskOverride(keep_runs=10**9),
    ):
        with pytest.raises(ValidationFailed):
            bad.over(merged)
    # The refusal names both values and where the one the task did not set came from.
    own = r"^VALIDATION_FAILED: keep_rows \(2\) must be larger than keep_runs \(2\)$"
    with pytest.raises(ValidationFailed, match=own):
        TaskOverride(keep_runs=2, keep_rows=2).over(merged)
    global_runs = r"keep_rows \(10\) must be larger than keep_runs \(50, the global value\)$"
    with pytest.raises(ValidationFailed, match=global_runs):
        TaskOverride(keep_rows=10).over(replace(merged, keep_runs=50, keep_rows=1000))
    with pytest.raises(ValidationFailed, match="keep_rows must be a whole number 1"):
        TaskOverride(keep_rows=0).over(merged)


def test_every_combination_keeps_exactly_the_union() -> None:
    """A small exhaustive check against a direct reading of the rule."""
    for keep_runs, keep_days, n in itertools.product((0, 1, 3), (0, 2), (1, 4)):
        runs = _runs(n)
        policy = RetentionPolicy(keep_runs, keep_days, keep_runs + 1, None)
        anchors = _anchors(runs, keep_runs, ok=runs[0].run_id)
        expired = set(plan_logs(runs, anchors, policy, NOW, limit=100).expire)
        for i, c in enumerate(runs):
            recent = i >= n - keep_runs if keep_runs else False
            young = keep_days > 0 and c.created_at_ms > NOW - keep_days * DAY_MS
            kept = recent or young or i == 0
            assert (c.attempt_id in expired) is not kept, (keep_runs, keep_days, n, i)


def test_settings_override_the_profile_and_refuse_contradictions() -> None:
    env = {"QL_PROFILE": "edge", "QL_RETENTION_KEEP_RUNS": "7", "QL_RETENTION_INTERVAL_S": "5"}
    s = Settings.from_env(env, data_dir="/nonexistent-qinglong")
    policy = s.retention.policy(s.profile)
    assert (policy.keep_runs, policy.keep_days, policy.keep_rows) == (7, 3, 100)
    assert s.retention.interval_of(s.profile) == 5.0
    assert s.retention.total_log_bytes_of(EDGE) == EDGE.retention.total_log_bytes
    assert RetentionSettings.from_env({"QL_RETENTION": "off"}).enabled is False
    for bad in (
        {"QL_RETENTION": "maybe"},
        {"QL_RETENTION_KEEP_RUNS": "-1"},
        {"QL_RETENTION_KEEP_RUNS": "10", "QL_RETENTION_KEEP_ROWS": "10"},
    ):
        with pytest.raises(ValueError):
            Settings.from_env(bad, data_dir="/nonexistent-qinglong")


def test_a_stored_override_the_global_settings_later_contradict_still_applies() -> None:
    # Stored while the global keep_runs was 10 (keep_rows 50 > 10 passed the PUT); the
    # operator then raised QL_RETENTION_KEEP_RUNS to 100. ``over`` refuses the pair, and a
    # sweep that asked only ``over`` failed its whole pass (and the free-space reserve with
    # it) at this task, every pass. The policy in force keeps more rows instead.
    from pathlib import Path
    from typing import Any, cast

    from app.domain.retention import GlobalBudgets
    from app.worker.log_retention import LogSweep

    base = RetentionPolicy(keep_runs=100, keep_days=0, keep_rows=1000, task_log_bytes=None)
    stored = TaskOverride(keep_rows=50)
    with pytest.raises(ValidationFailed):
        stored.over(base)  # a PUT of this pair now is still refused
    assert stored.in_force(base) == base
    narrow = RetentionPolicy(keep_runs=100, keep_days=0, keep_rows=101, task_log_bytes=None)
    assert TaskOverride(keep_runs=200, keep_rows=150).in_force(narrow).keep_rows == 401
    sweep = LogSweep(
        repo=cast(Any, None), logs_root=Path("/nonexistent"), policy=base,
        budgets=GlobalBudgets(total_log_bytes=None, free_reserve_bytes=0),
        tasks_per_pass=1, files_per_pass=1,
    )  # fmt: skip
    assert sweep._policy_of("t", {"t": stored}) == base
