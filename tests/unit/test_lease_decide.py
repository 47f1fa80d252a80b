"""Who may take the worker lease (pure decision) and the lease settings."""

from __future__ import annotations

import pytest

from app.domain.errors import LeaseLost
from app.domain.lease import Claimant, Lease, Take, decide
from app.settings import Settings

ME = Claimant(instance_id="me", host="a", boot_id="b", pid=10, start_ticks=1)


def lease(instance_id: str, *, expires_at_ms: int = 1_000, released: bool = False) -> Lease:
    """A lease row of ``instance_id`` epoch 3."""
    return Lease(
        instance_id=instance_id, host="h", boot_id="b", pid=9, start_ticks=1, epoch=3,
        acquired_at_ms=0, renewed_at_ms=0, expires_at_ms=expires_at_ms,
        released_at_ms=500 if released else None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("current", "now", "holder_alive", "expected"),
    [
        (None, 0, False, Take.NEW),
        (lease("me"), 10, False, Take.RESTART),  # its previous worker is gone
        (lease("me"), 10, True, Take.HELD),  # a second worker on the same data dir
        (lease("me"), 1_000, True, Take.RESTART),  # expired: even a stopped holder lost it
        (lease("me", released=True), 10, True, Take.RESTART),
        (lease("other"), 999, False, Take.HELD),  # another host's: wait for the expiry
        (lease("other"), 1_000, False, Take.EXPIRED),
        (lease("other", released=True), 10, True, Take.RELEASED),
    ],
)
def test_decide(current: Lease | None, now: int, holder_alive: bool, expected: Take) -> None:
    assert decide(current, ME, now_ms=now, holder_alive=holder_alive) is expected


def test_a_lost_lease_says_who_took_it() -> None:
    assert (
        "taken over by instance other on host h (epoch 3)"
        in LeaseLost(epoch=2, holder=lease("other")).detail
    )
    assert "could not be renewed" in LeaseLost(epoch=3, holder=None).detail


def test_lease_settings_default_and_validate() -> None:
    s = Settings.from_env({})
    assert (s.lease_ttl_s, s.lease_renew_s) == (30.0, 10.0)
    s = Settings.from_env({"QL_WORKER_LEASE_TTL_S": "3"})
    assert (s.lease_ttl_s, s.lease_renew_s) == (3.0, 1.0)  # renewal follows a short TTL
    s = Settings.from_env({"QL_WORKER_LEASE_TTL_S": "4", "QL_WORKER_LEASE_RENEW_S": "0.5"})
    assert (s.lease_ttl_s, s.lease_renew_s) == (4.0, 0.5)
    for bad in ({"QL_WORKER_LEASE_TTL_S": "x"}, {"QL_WORKER_LEASE_TTL_S": "0"},
                {"QL_WORKER_LEASE_TTL_S": "10", "QL_WORKER_LEASE_RENEW_S": "6"}):  # fmt: skip
        with pytest.raises(ValueError, match="QL_WORKER_LEASE"):
            Settings.from_env(bad)
