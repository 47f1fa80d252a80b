"""The two deployment profiles (docs/design.md §4) as typed, frozen values."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MIB = 1024 * 1024
# receipts/ may be a file system of its own: a run's receipt takes 4 KiB there, and a run
# starts only with this much free (docs/design.md §3.3 rule 8), else it waits queued.
RECEIPTS_BYTES_TO_START = 1 * MIB


class ProfileName(StrEnum):
    """Names accepted by ``QL_PROFILE``."""

    EDGE = "edge"
    STANDALONE = "standalone"


@dataclass(frozen=True, slots=True)
class RetentionDefaults:
    """What a profile keeps of finished runs (docs/retention.md §1); QL_RETENTION_* override."""

    keep_runs: int  # the newest runs of a task that keep their logs
    keep_days: int  # runs younger than this keep their logs (0: none by age)
    keep_rows: int  # the newest runs of a task that keep their rows (more than keep_runs)
    task_log_bytes: int  # log bytes per task
    total_log_bytes: int  # log bytes of every task together
    interval_s: float  # the sweep's cadence (it also runs when a run ends)
    tasks_per_pass: int  # pages: tasks examined per pass
    # Logs expired per pass, at most: each shard touched is fsynced once per pass, so larger
    # passes cost fewer fsyncs per log (bench/README.md, retention).
    files_per_pass: int


@dataclass(frozen=True, slots=True)
class Profile:
    """Resource budgets of one deployment profile."""

    name: ProfileName
    dispatch_page_size: int
    log_quota_bytes: int
    free_space_reserve_bytes: int
    reconcile_interval_s: float
    reconcile_pages: int
    reconcile_page_size: int
    receipt_publish_grace_s: float
    stop_grace_s: float
    consumed_receipt_retention_s: float
    quarantine_retention_s: float
    # Attempts admitted at once (run dispatching or running), QL_MAX_RUNNING overrides it
    # (docs/concurrency-budgets.md §1): edge is sized for 2 cores.
    max_running: int
    retention: RetentionDefaults

    @property
    def free_bytes_to_start(self) -> int:
        """Free space a run needs to start (the disk admission, docs/design.md §3.3 rule 8):
        the reserve plus one log's quota. The dispatcher and /readyz apply this one rule."""
        return self.free_space_reserve_bytes + self.log_quota_bytes


EDGE = Profile(
    name=ProfileName.EDGE,
    dispatch_page_size=4,
    log_quota_bytes=4 * MIB,
    free_space_reserve_bytes=32 * MIB,
    reconcile_interval_s=30.0,
    reconcile_pages=2,
    reconcile_page_size=8,
    receipt_publish_grace_s=0.050,
    stop_grace_s=5.0,
    consumed_receipt_retention_s=120.0,
    quarantine_retention_s=300.0,
    max_running=2,
    retention=RetentionDefaults(
        keep_runs=10,
        keep_days=3,
        keep_rows=100,
        task_log_bytes=64 * MIB,
        total_log_bytes=256 * MIB,
        interval_s=60.0,
        tasks_per_pass=4,
        files_per_pass=256,
    ),
)
STANDALONE = Profile(
    name=ProfileName.STANDALONE,
    dispatch_page_size=16,
    log_quota_bytes=64 * MIB,
    free_space_reserve_bytes=256 * MIB,
    reconcile_interval_s=5.0,
    reconcile_pages=4,
    reconcile_page_size=32,
    receipt_publish_grace_s=0.100,
    stop_grace_s=10.0,
    consumed_receipt_retention_s=60.0,
    quarantine_retention_s=3600.0,
    max_running=8,
    retention=RetentionDefaults(
        keep_runs=50,
        keep_days=14,
        keep_rows=1000,
        task_log_bytes=1024 * MIB,
        total_log_bytes=16 * 1024 * MIB,
        interval_s=30.0,
        tasks_per_pass=8,
        files_per_pass=1024,
    ),
)
PROFILES = {EDGE.name: EDGE, STANDALONE.name: STANDALONE}


def profile_named(name: str) -> Profile:
    """Look a profile up by name; raise ValueError with the accepted names otherwise."""
    try:
        return PROFILES[ProfileName(name)]
    except ValueError:
        raise ValueError(f"unknown profile {name!r}; use edge or standalone") from None
