"""UUIDv7 identifiers (RFC 9562): time-ordered, 74 random bits."""

from __future__ import annotations

import os
import threading
import time
import uuid

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


def is_uuid7(text: str) -> bool:
    """True when ``text`` is a canonical lowercase UUIDv7 string."""
    try:
        parsed = uuid.UUID(text)
    except (ValueError, TypeError, AttributeError):
        return False
    return str(parsed) == text and parsed.version == 7 and parsed.variant == uuid.RFC_4122


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000
