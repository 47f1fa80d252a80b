"""The token cache: fresh hits only, bounded, keyed by digest, expiry bounds revocation."""

from __future__ import annotations

from app.context.token_cache import TokenCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cached_principal_expires_after_the_ttl() -> None:
    clock = Clock()
    cache: TokenCache[str] = TokenCache(ttl_s=1.0, clock=clock)
    cache.put("ql_token", "principal")
    clock.now += 0.999
    assert cache.get("ql_token") == "principal"
    clock.now += 0.002  # a revocation committed now is seen by the next lookup
    assert cache.get("ql_token") is None


def test_the_cache_is_bounded_and_never_keeps_the_plaintext() -> None:
    cache: TokenCache[int] = TokenCache(max_entries=3, clock=Clock())
    for i in range(5):
        cache.put(f"ql_token_{i}", i)
    assert [cache.get(f"ql_token_{i}") for i in range(5)] == [None, None, 2, 3, 4]
    assert not any(b"ql_token" in key for key in cache._entries)
