"""Concurrent puts of one new secret name: one creates it, the others overwrite it."""

from __future__ import annotations

import threading

from sqlalchemy import Engine

from app.storage.secret_crypto import KeyRing, new_key
from app.storage.secrets_repo import SecretRepository


def _race(repo: SecretRepository, name: str, threads: int) -> list[object]:
    """``threads`` puts of ``name`` released together; each put's answer or exception."""
    barrier = threading.Barrier(threads)
    results: list[object] = []

    def put(i: int) -> None:
        barrier.wait()
        try:
            results.append(repo.put(name=name, value=f"v{i}"))
        except Exception as exc:  # the outcome is what is asserted
            results.append(exc)

    workers = [threading.Thread(target=put, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    return results


def test_concurrent_puts_of_a_new_name_all_succeed_and_one_creates_it(engine: Engine) -> None:
    # On PostgreSQL the UPDATE of a name that does not exist yet locks nothing, so puts race
    # to INSERT it; the losers must become updates, not unique-violation errors.
    repo = SecretRepository(engine, KeyRing([new_key()]))
    threads = 4
    for round_ in range(20):
        name = f"s{round_}"
        results = _race(repo, name, threads)
        assert sorted(results, key=repr) == [False] * (threads - 1) + [True], results
        assert repo.resolve(frozenset({name}))[name] in {f"v{i}" for i in range(threads)}
