"""A short-lived cache of authenticated tokens, so a read does not pay a lookup per request.

Entries live ``ttl_s`` (1 s by default): a token revoked with ``qinglong token revoke`` (from
any process) is refused everywhere at most that long after the revocation committed. Keys are
SHA-256 digests, never the token itself; only successful lookups are cached.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

P = TypeVar("P")

DEFAULT_TTL_S = 1.0
DEFAULT_MAX_ENTRIES = 256


class TokenCache(Generic[P]):
    """Digest → (principal, expiry), bounded, thread-safe."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[P, float]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()

    def get(self, token: str) -> P | None:
        """The cached principal of ``token`` if it is still fresh."""
        key = self._key(token)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[1] <= self._clock():
                del self._entries[key]
                return None
            return entry[0]

    def put(self, token: str, principal: P) -> None:
        """Remember a successful lookup for ``ttl_s``."""
        key = self._key(token)
        with self._lock:
            self._entries[key] = (principal, self._clock() + self._ttl_s)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
