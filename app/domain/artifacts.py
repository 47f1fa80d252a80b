"""Where an attempt's files live, derived from its id alone (docs/design.md §3.6, §3.11).

Shards use the last two hex digits of the attempt id: the random tail of a UUIDv7, so the
256 shard directories fill evenly (a time-ordered prefix would put every new file in one).
"""

from __future__ import annotations

from app.domain.ids import is_uuid7

LOG_ARTIFACT_PREFIX = "log:"
RECEIPT_SUFFIX = ".json"
_TEMP_PREFIX, _TEMP_SUFFIX = ".", ".tmp"
# Every shard directory's name: what ``shard_of`` can answer.
SHARD_NAMES = tuple(f"{n:02x}" for n in range(256))


# The most of a log's quota kept for the output's last bytes (docs/disk-full-and-readiness.md):
# the shim keeps them in memory and writes them after the head when the job ends.
LOG_TAIL_MAX_BYTES = 64 * 1024


def log_tail_bytes(quota: int) -> int:
    """The part of ``quota`` kept for the output's end: a quarter, at most 64 KiB.

    The shim spells it again (``_tail_bytes``: it imports nothing from ``app``);
    tests/unit/test_artifacts.py checks that the two agree.
    """
    return min(LOG_TAIL_MAX_BYTES, max(quota, 0) // 4)


def log_head_bytes(quota: int) -> int:
    """The size a log reaches while its job runs before output is held back for the tail."""
    return max(quota - log_tail_bytes(quota), 0)


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


def publish_temp_name(name: str) -> str:
    """The temp file the shim writes ``name`` under before it links it (docs/design.md §3.11).

    The shim spells it again (``_Published``: it imports nothing from ``app``);
    tests/unit/test_artifacts.py checks that the two agree.
    """
    return _TEMP_PREFIX + name + _TEMP_SUFFIX


def published_by_temp(temp_name: str) -> str | None:
    """The name a ``publish_temp_name`` temp file publishes; None for any other name."""
    inner = temp_name.removeprefix(_TEMP_PREFIX)
    if inner == temp_name or not inner.endswith(_TEMP_SUFFIX):
        return None
    return inner.removesuffix(_TEMP_SUFFIX) or None


def truncation_fact_temp_relpath(attempt_id: str) -> str:
    """The shim's temp file of the truncation fact (published by link, docs/design.md §3.11)."""
    return f"{shard_of(attempt_id)}/{publish_temp_name(attempt_id + '.log.truncated')}"


def receipt_name(attempt_id: str) -> str:
    """The completion receipt's file name in its shard: ``<attempt_id>.json``."""
    return attempt_id + RECEIPT_SUFFIX


def receipt_temp_relpath(attempt_id: str) -> str:
    """The shim's reserved receipt temp file, in the receipt's shard."""
    return f"{shard_of(attempt_id)}/{publish_temp_name(receipt_name(attempt_id))}"


def receipt_relpath(attempt_id: str) -> str:
    """Completion receipt path relative to the receipts root: ``<shard>/<attempt_id>.json``."""
    return f"{shard_of(attempt_id)}/{receipt_name(attempt_id)}"


def quarantine_relpath(attempt_id: str) -> str:
    """Where a bad receipt is moved, relative to the receipts root (private 0700 shard)."""
    return f".quarantine/{shard_of(attempt_id)}/{receipt_name(attempt_id)}"
