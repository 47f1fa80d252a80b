"""What a failed PostgreSQL connect says in an operator's one line (app/storage/unavailable.py).

Real psycopg exception classes with libpq's message shapes; no server needed.
"""

from __future__ import annotations

import psycopg
import pytest

from app.domain.errors import DatabaseUnreachable
from app.storage.unavailable import connect_failure_reason

AT = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


def _reason(message: str) -> str | None:
    try:
        try:
            raise psycopg.OperationalError(message)
        except psycopg.OperationalError as exc:
            raise DatabaseUnreachable() from exc
    except DatabaseUnreachable as outage:
        return connect_failure_reason(outage)


@pytest.mark.parametrize(
    ("message", "said"),
    [
        (AT + 'FATAL:  role "app" does not exist', 'FATAL: role "app" does not exist'),
        (AT + "Connection refused\n\tIs the server running on that host?", "Connection refused"),
        (AT + "server closed the connection unexpectedly", "server closed the connection unexpectedly"),
        # A host that did not resolve is said without its name: with an unescaped "@" in the
        # password (app:p@ss@db), the "host" is ss@db.
        ("connection failed: failed to resolve host 'ss@db': [Errno -2] Name or service not known",
         "the host name did not resolve"),
        (AT + 'could not translate host name "ss@db" to address', "the host name did not resolve"),
        (AT + 'something else about "ss@db"', 'something else about "..."'),
    ],
)
def test_the_drivers_words_without_what_a_url_could_leak(message: str, said: str) -> None:
    assert _reason(message) == said


def test_an_outage_without_a_driver_error_has_no_words() -> None:
    assert connect_failure_reason(DatabaseUnreachable()) is None
