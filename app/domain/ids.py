"""UUIDv7 identifiers (RFC 9562): time-ordered, 74 random bits."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def uuid7(now_ms: int | None = None) -> str:
    """Return a new UUIDv7 string; monotonic within one process even inside one millisecond."""
    global _last_ms, _last_rand
    with _lock:
        ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if ms <= _last_ms:
            # Same (or a backwards) millisecond: keep the timestamp and bump the random part
            # so ids created by one process still sort in creation order.
            ms = _last_ms
            rand = (_last_rand + 1) & ((1 << 74) - 1)
        else:
            rand = int.from_bytes(os.urandom(10), "big") >> 6
        _last_ms, _last_rand = ms, rand
    rand_a = rand >> 62
    rand_b = rand & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return str(uuid.UUID(int=value))


# Canonical lowercase text, version nibble 7, RFC 4122 variant (10xx): what
# ``str(uuid.UUID(text)) == text`` with version 7 checked, at a fifth of the cost (every read
# of a run validates its id).
UUID7_PATTERN = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
_UUID7 = re.compile(UUID7_PATTERN)


def is_uuid7(text: str) -> bool:
    """True when ``text`` is a canonical lowercase UUIDv7 string."""
    return isinstance(text, str) and _UUID7.fullmatch(text) is not None


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def utc_instant(ms: int) -> str:
    """Epoch milliseconds as an RFC 3339 instant in UTC, its milliseconds only when some: the
    one form every command and message writes an instant in (``2026-12-07T03:00:00Z``)."""
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    text = at.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
    return text.replace("+00:00", "Z")


def uuid7_floor(ms: int) -> str:
    """The smallest canonical UUIDv7 text of millisecond ``ms`` (clamped to the 48-bit
    range): every id made at ``ms`` or later sorts at or above it, as text and as a number."""
    ms = min(max(ms, 0), (1 << 48) - 1)
    return str(uuid.UUID(int=ms << 80 | 0x7 << 76 | 0b10 << 62))
