"""PostgreSQL pool: an idle connection the server cut is replaced before anyone uses it.

The engine pings only connections that sat idle (not every checkout); this proves the
ping still happens where it matters, against a real server that really closed the backend.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from app.storage import engine as engine_module
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from tests.storage.helpers import define_task, enqueue


@pytest.mark.postgres
def test_an_idle_connection_cut_by_the_server_is_replaced(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.05)
    engine = make_engine(postgres_url)
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        define_task(engine, task="pool")
        run = enqueue(engine, task="pool")
        with engine.connect() as conn:
            backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        assert engine.pool.checkedin() == 1  # the connection waits in the pool
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": backend}).scalar()
        time.sleep(0.1)  # idle longer than the ping threshold
        # Both the transactional path and the one-statement read path get a live connection.
        assert RunReader(engine).get_run(run.id).id == run.id
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != backend
    finally:
        admin.dispose()
        engine.dispose()
