"""Retention end to end through a real ``qinglong serve`` (docs/retention.md), both engines.

A task keeps 2 runs' logs (and none by age); five runs end; the worker's sweep (kicked by
each ending, and on a short cadence) expires the three oldest logs: their runs show
``log.expired``, their logs answer 410 ``LOG_EXPIRED``, the files are gone, and the storage
endpoint's figures say so. A pinned run keeps its log through the same policy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.domain.artifacts import log_relpath
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from tests.e2e.conftest import ServeFactory, wait_until
from tests.e2e.kit import enqueue, get_run, put_task, read_log, wait_status
from tests.kit import web

pytestmark = pytest.mark.e2e


def test_keep_runs_2_expires_the_old_logs_410_log_expired_and_storage_figures(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    # A 3 s cadence besides the kicks: an ending recorded by the reconciler instead of the
    # live path (the watcher) kicks nothing, the cadence covers it.
    served = serve_factory(database_url=db_url, extra_env={"QL_RETENTION_INTERVAL_S": "3"})
    api = served.base_url + "/api/v1"
    put_task(served, "kept", "echo hello from $QL3_RUN_ID", tmp_path)
    # keep_days 0: the profile's 14 days would keep every one of these young runs.
    body = {"keep_runs": 2, "keep_days": 0}
    r = web.put(f"{api}/tasks/kept/retention", json=body, headers=served.auth)
    assert r.status_code == 201, r.text
    assert r.json()["effective"]["keep_runs"] == 2
    assert r.json()["override"]["keep_rows"] is None
    assert r.json()["effective"]["keep_rows"] == 1000  # standalone's row budget
    got = web.get(f"{api}/tasks/kept/retention", headers=served.auth).json()
    assert got == r.json()

    # The first run is pinned before the others end: it keeps its log whatever the policy.
    pinned = enqueue(served, "kept")
    wait_status(served, pinned, {"succeeded"})
    r = web.post(f"{api}/runs/{pinned}/pin", headers=served.auth)
    assert r.status_code == 200 and r.json()["pinned"] is True, r.text
    runs = [enqueue(served, "kept") for _ in range(5)]
    for run_id in runs:
        wait_status(served, run_id, {"succeeded"})
    old, kept = runs[:3], runs[3:]

    def expired(run_id: str) -> bool:
        return bool(get_run(served, run_id)["latest_attempt"]["log"]["expired"])

    wait_until("the three oldest logs expired", lambda: all(expired(r) for r in old), 20)
    engine = make_engine(db_url)
    try:
        reader = RunReader(engine)
        for run_id in old:
            log = get_run(served, run_id)["latest_attempt"]["log"]
            assert log["bytes"] > 0 and log["expired_at_ms"] is not None
            r = web.get(f"{api}/runs/{run_id}/attempts/1/log", headers=served.auth)
            assert r.status_code == 410, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["code"] == "LOG_EXPIRED"
            attempt_id = reader.get_attempt(run_id, 1).id
            assert not (served.data_dir / "logs" / log_relpath(attempt_id)).exists()
    finally:
        engine.dispose()  # a pooled PostgreSQL connection left to the GC warns in a later test
    for run_id in [*kept, pinned]:
        assert not expired(run_id)
        assert read_log(served, run_id).startswith(b"hello from")

    r = web.get(f"{api}/system/storage", headers=served.auth)
    assert r.status_code == 200, r.text
    storage = r.json()
    assert storage["retention_enabled"] is True
    assert (storage["logs_expired"], storage["logs_kept"], storage["runs_kept"]) == (3, 3, 6)
    assert storage["log_bytes"] == sum(
        get_run(served, r)["latest_attempt"]["log"]["bytes"] for r in [*kept, pinned]
    )
    assert storage["reserve_bytes"] == 256 * 1024 * 1024  # standalone's free-space reserve
    assert storage["free_bytes"] > 0
    assert storage["last_sweep"] is not None and storage["last_sweep"]["at_ms"] > 0

    # Unpinning hands the run back to the policy: the next kick (another run ending) takes it.
    assert web.post(f"{api}/runs/{pinned}/unpin", headers=served.auth).json()["pinned"] is False
    wait_status(served, enqueue(served, "kept"), {"succeeded"})
    wait_until("the unpinned run's log expired", lambda: expired(pinned), 20)
