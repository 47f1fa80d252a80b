"""PostgreSQL goes away under a real ``qinglong serve`` while a job runs, and comes back.

The service reaches the server through a relay the test cuts: every connection closed and
new ones refused, what the service sees of a PostgreSQL restart. The job ends during the
outage. Meanwhile the api answers 503 ``DATABASE_UNREACHABLE`` (never 500) and ``/readyz``
503, no service process restarts (the outage is shorter than the worker lease's TTL), and
the job's ending waits in its receipt. Once the server answers again, the run ends with the
job's exit code and one terminal event, without a restart, and a new run goes through.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import private_pg_schema
from tests.e2e.conftest import ServeFactory, wait_until
from tests.e2e.kit import enqueue, put_task, terminal_events, wait_status
from tests.kit import web
from tests.kit.relay import Relay, relayed

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

TERMINAL = {"succeeded", "failed", "lost", "cancelled", "timed_out"}


@pytest.fixture
def relayed_pg() -> Iterator[tuple[str, Relay]]:
    """A fresh schema through a relay; requested before ``serve_factory``, so both outlive
    the service."""
    with private_pg_schema("ql_outage_serve") as url, relayed(url) as (through, relay):
        yield through, relay


def test_a_job_that_ends_while_postgresql_is_away_is_recorded_once_it_is_back(
    relayed_pg: tuple[str, Relay], serve_factory: ServeFactory, tmp_path: Path
) -> None:
    url, relay = relayed_pg
    served = serve_factory(database_url=url)
    base, auth = served.base_url, served.auth
    gates = tmp_path / "gates"
    gates.mkdir()
    put_task(served, "gated", "while [ ! -e go ]; do sleep 0.02; done; touch ended; exit 3", gates)
    put_task(served, "noop", "true")
    run_id = enqueue(served, "gated")
    wait_status(served, run_id, {"running"})
    services = served.wait_services()

    relay.cut()
    try:
        (gates / "go").touch()
        wait_until("the job to end", (gates / "ended").exists, 20)
        r = web.post(f"{base}/api/v1/runs", json={"task": "noop"}, headers=auth, timeout=10)
        assert r.status_code == 503, r.text  # never 500
        assert r.json()["code"] == "DATABASE_UNREACHABLE" and int(r.headers["retry-after"]) > 0
        r = web.get(f"{base}/api/v1/runs/{run_id}", headers=auth, timeout=10)
        assert r.status_code == 503 and r.json()["code"] == "DATABASE_UNREACHABLE", r.text
        ready = web.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 503
        assert "database: database unreachable" in ready.json()["detail"]
        time.sleep(2)  # the worker's completion of the ended job meets the outage too
    finally:
        relay.resume()

    run = wait_status(served, run_id, TERMINAL, timeout=60)
    attempt = run["latest_attempt"]
    assert (run["status"], attempt["exit_code"], attempt["error_code"]) == ("failed", 3, None)
    assert terminal_events(served, run_id) == ["run.failed"]
    assert served.service_pids() == services  # nothing restarted, the lease kept
    after = enqueue(served, "noop")
    assert wait_status(served, after, TERMINAL)["status"] == "succeeded"
    log = served.log()
    assert "Traceback" not in log and "unhandled" not in log
    assert "DatabaseUnreachable" in log  # the passes that met the outage say so, by type
    assert "psycopg" not in log and "OperationalError" not in log  # no driver text
