"""A full data disk under a real ``qinglong serve --workers 2`` (data dir on a 60 MiB tmpfs):
the api's metric files never kill an api process (docs/metrics.md § A full disk).

The operator's observation, rerun: with the disk full, a SIGHUP's replacement uvicorn worker
died of SIGBUS as it made its first metric (prometheus-client writes its file through a
mapping, and a page of a sparse file on a full disk cannot be backed), so every rolling
restart aborted.
"""

from __future__ import annotations

import os
import signal
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.context.metrics import FILE_BYTES
from tests.disk import fill, mounted_tmpfs
from tests.e2e.conftest import ServeFactory, wait_until
from tests.e2e.kit import enqueue, put_task, wait_status
from tests.e2e.test_metrics_serve import _scrape
from tests.e2e.test_supervisor import uvicorn_workers

pytestmark = pytest.mark.e2e
SCRAPES = 10


@pytest.fixture
def data_disk(tmp_path: Path) -> Iterator[Path]:
    """The data dir's tmpfs; requested before ``serve_factory`` so it is unmounted after."""
    with mounted_tmpfs(tmp_path / "data") as disk:
        yield disk


def test_a_rolling_restart_on_a_full_disk_replaces_every_api_worker_and_metrics_answer(
    data_disk: Path, serve_factory: ServeFactory
) -> None:
    # edge: its log reserve and quota fit a 60 MiB disk, so the run starts before it fills
    served = serve_factory(workers=2, data_dir=data_disk, extra_env={"QL_PROFILE": "edge"})
    api = served.service_pids()["api"]
    wait_until("two uvicorn workers", lambda: len(uvicorn_workers(api)) == 2, 30)
    put_task(served, "noop", "true")
    rid = enqueue(served, "noop")
    run = wait_status(served, rid, {"succeeded", "failed", "lost"})
    assert run["status"] == "succeeded", run
    before = _scrape(served)
    assert before["qinglong_created_to_started_seconds_count"] == 1
    # Each file has every block it will ever write to, and its series fit in them.
    for db in (data_disk / "metrics").glob("*.db"):
        st = db.stat()
        assert st.st_size == FILE_BYTES and st.st_blocks * 512 >= FILE_BYTES, db.name
        assert struct.unpack("i", db.read_bytes()[:4])[0] < FILE_BYTES // 2, db.name

    old = set(uvicorn_workers(api))
    files = {db.name for db in (data_disk / "metrics").iterdir()}
    filler = fill(data_disk)
    try:
        os.kill(served.pid, signal.SIGHUP)
        wait_until(
            "both api workers replaced on the full disk",
            lambda: len(uvicorn_workers(api)) == 2 and not set(uvicorn_workers(api)) & old,
            60,
        )
        assert served.service_pids()["api"] == api  # a rolling restart, not a new api
        # No room for the new workers' files: none made (an empty one would break every
        # scrape); they keep their observations in memory and report the others'.
        assert {db.name for db in (data_disk / "metrics").iterdir()} == files
        for _ in range(SCRAPES):  # the replaced workers' figures are still summed
            got = _scrape(served)
            assert got["qinglong_created_to_started_seconds_count"] == 1
            assert got["qinglong_runs|status=succeeded"] == 1
    finally:
        filler.unlink()
