"""Where an attempt's files live, derived from its id alone (docs/design.md §3.6, §3.11).

Shards use the last two hex digits of the attempt id: the random tail of a UUIDv7, so the
256 shard directories fill evenly (a time-ordered prefix would put every new file in one).
"""

from __future__ import annotations

from app.domain.ids import is_uuid7

LOG_ARTIFACT_PREFIX = "log:"


def shard_of(attempt_id: str) -> str:
    """Two lowercase hex digits naming the shard directory of ``attempt_id``."""
    if not is_uuid7(attempt_id):
        raise ValueError("attempt ids are UUIDv7 strings")
    return attempt_id[-2:]


def log_artifact_id(attempt_id: str) -> str:
    """The artifact id stored on the attempt for its log."""
    return LOG_ARTIFACT_PREFIX + attempt_id


def log_relpath(attempt_id: str) -> str:
    """Log file path relative to the logs root: ``<shard>/<attempt_id>.log``."""
    return f"{shard_of(attempt_id)}/{attempt_id}.log"


def truncation_fact_relpath(attempt_id: str) -> str:
    """The shim's one-time truncation fact, beside the log."""
    return log_relpath(attempt_id) + ".truncated"


def truncation_fact_temp_relpath(attempt_id: str) -> str:
    """The shim's temp file of the truncation fact (published by link, docs/design.md §3.11)."""
    return f"{shard_of(attempt_id)}/.{attempt_id}.log.truncated.tmp"


def receipt_temp_relpath(attempt_id: str) -> str:
    """The shim's reserved receipt temp file, in the receipt's shard."""
    return f"{shard_of(attempt_id)}/.{attempt_id}.json.tmp"


def receipt_relpath(attempt_id: str) -> str:
    """Completion receipt path relative to the receipts root: ``<shard>/<attempt_id>.json``."""
    return f"{shard_of(attempt_id)}/{attempt_id}.json"


def quarantine_relpath(attempt_id: str) -> str:
    """Where a bad receipt is moved, relative to the receipts root (private 0700 shard)."""
    return f".quarantine/{shard_of(attempt_id)}/{attempt_id}.json"
