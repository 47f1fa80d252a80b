"""bench.burst's A/B order: neither checkout always bursts second (the faster slot)."""

from __future__ import annotations

from bench.burst import order


def test_each_side_bursts_first_in_every_other_round() -> None:
    rounds = [order(i) for i in range(4)]
    assert all(sorted(r) == ["base", "ours"] for r in rounds)  # both burst every round
    assert [r[0] for r in rounds] == ["base", "ours", "base", "ours"]
