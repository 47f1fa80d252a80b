"""A full disk under a real ``qinglong serve`` (edge profile, data dir on a 60 MiB tmpfs).

The issue's observation, rerun: the disk fills while a job writes, the job exits 7 while it
is full. Meanwhile POST /api/v1/runs answers 503 STORAGE_UNAVAILABLE (never 500) and /readyz
503; the run stays ``running`` (its shim keeps the ending). Once space returns the run ends
``failed`` with exit code 7 and one terminal event, the log info counts every dropped byte,
and no temp file is left in ``receipts/``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.disk import fill, mounted_tmpfs
from tests.e2e.conftest import ServeFactory, wait_until
from tests.e2e.kit import enqueue, events, get_run, put_task, terminal_events, wait_status
from tests.kit import web

pytestmark = pytest.mark.e2e

FIRST = 1 << 20
THEN = 3_000_000  # edge quota is 4 MiB: every byte dropped here is the full disk's


@pytest.fixture
def data_disk(tmp_path: Path) -> Iterator[Path]:
    """The data dir's tmpfs; requested before ``serve_factory`` so it is unmounted after."""
    with mounted_tmpfs(tmp_path / "data") as disk:
        yield disk


def _log_bytes(served_run: dict[str, object]) -> int:
    attempt = served_run["latest_attempt"]
    assert isinstance(attempt, dict)
    return int(attempt["log"]["bytes"])


def test_a_job_ending_on_a_full_disk_is_recorded_with_its_exit_code_once_space_returns(
    data_disk: Path, serve_factory: ServeFactory, tmp_path: Path
) -> None:
    served = serve_factory(data_dir=data_disk, extra_env={"QL_PROFILE": "edge"})
    gates = tmp_path / "gates"
    gates.mkdir()
    put_task(
        served,
        "writer",
        f"head -c {FIRST} /dev/zero; while [ ! -e full ]; do sleep 0.02; done; "
        f"head -c {THEN} /dev/zero; touch wrote; while [ ! -e exit ]; do sleep 0.02; done; "
        "exit 7",
        gates,
    )
    put_task(served, "noop", "true")
    run_id = enqueue(served, "writer")
    wait_status(served, run_id, {"running"})
    wait_until("the first MiB logged", lambda: _log_bytes(get_run(served, run_id)) == FIRST, 20)

    filler = fill(data_disk)
    try:
        (gates / "full").touch()
        wait_until("the job wrote on the full disk", (gates / "wrote").exists, 20)
        (gates / "exit").touch()

        base, auth = served.base_url, served.auth
        for _ in range(2000):
            r = web.post(f"{base}/api/v1/runs", json={"task": "noop"}, headers=auth)
            assert r.status_code in (201, 503), r.text  # never 500
            if r.status_code == 503:
                break
        assert r.status_code == 503 and r.json()["code"] == "STORAGE_UNAVAILABLE", r.text
        assert int(r.headers["retry-after"]) > 0
        ready = web.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 503 and "disk: free space" in ready.json()["detail"]
        assert get_run(served, run_id)["status"] == "running"  # the ending is kept, not lost
    finally:
        filler.unlink()

    run = wait_status(served, run_id, {"failed", "lost", "succeeded"}, timeout=60)
    attempt = run["latest_attempt"]
    assert (run["status"], attempt["exit_code"], attempt["error_code"]) == ("failed", 7, None)
    assert terminal_events(served, run_id) == ["run.failed"]
    log = attempt["log"]
    assert log["truncated"] is True
    assert log["dropped_bytes"] == FIRST + THEN - log["bytes"] > 0
    assert log["truncation_reason"] == "disk_full"
    temps = [
        p.name
        for shard in (data_disk / "receipts").iterdir()
        if shard.is_dir()
        for p in shard.iterdir()
        if p.name.endswith(".tmp")
    ]
    assert temps == []
    # Ready again once free space is back and the refused write is forgotten (10 s).
    wait_until("ready", lambda: web.get(f"{base}/readyz", timeout=5).status_code == 200, 20)


CHATTY = 3_500_000  # under the edge quota (4 MiB): no truncation, each log whole


def test_runs_whose_own_logs_filled_the_disk_start_once_retention_frees_what_a_run_needs(
    data_disk: Path, serve_factory: ServeFactory
) -> None:
    """A queue that fills its own disk with logs drains by itself. On the 60 MiB tmpfs (edge:
    reserve 32 MiB, a run needs reserve + its 4 MiB quota = 36 MiB to start), a sixth or so
    3.5 MiB log leaves free space between the reserve and 36 MiB. Runs then wait; the sweep
    must free up to what a run needs (the admission's rule), not only up to the reserve, or
    nothing frees space and the queue waits for ever."""
    served = serve_factory(
        data_dir=data_disk, extra_env={"QL_PROFILE": "edge", "QL_RETENTION_INTERVAL_S": "1"}
    )
    put_task(served, "chatty", f"head -c {CHATTY} /dev/zero")
    ids = [enqueue(served, "chatty") for _ in range(14)]
    for run_id in ids:  # in order: each waits for space the previous ones' logs took
        run = wait_status(served, run_id, {"succeeded", "failed", "lost", "cancelled"}, timeout=60)
        assert run["status"] == "succeeded" and _log_bytes(run) == CHATTY, run
    expired = [get_run(served, r)["latest_attempt"]["log"].get("expired") for r in ids]
    assert expired[0] is True and expired[-1] is False  # the oldest went for the newest
    assert all(terminal_events(served, r) == ["run.succeeded"] for r in ids)


@pytest.fixture
def own_receipts(tmp_path: Path) -> Iterator[Path]:
    """A data dir whose receipts/ is a 2 MiB tmpfs of its own; requested before
    ``serve_factory`` so it is unmounted after the service stopped."""
    data = tmp_path / "data-own-receipts"
    data.mkdir(mode=0o700)
    with mounted_tmpfs(data / "receipts", size_mib=2):
        yield data


def test_a_run_waits_while_receipts_of_their_own_cannot_take_a_receipt(
    own_receipts: Path, serve_factory: ServeFactory
) -> None:
    """receipts/ on a file system of its own, full: the launch's receipt reservation would
    fail (RECEIPT_RESERVE_FAILED ENOSPC, the run failed for good). The admission sees it
    first: the run stays queued with nothing but its queued event, /readyz says why, and it
    runs once space returns."""
    filler = fill(own_receipts / "receipts")
    served = serve_factory(data_dir=own_receipts)
    put_task(served, "noop", "echo ran")
    run_id = enqueue(served, "noop")
    try:
        wait_until(
            "readyz says receipts",
            lambda: "free space for receipts below 1 MiB"
            in web.get(f"{served.base_url}/readyz", timeout=5).text,
            20,
        )
        time.sleep(2.5)  # a slow tick (2 s) retried the admission: still waiting
        run = get_run(served, run_id)
        assert run["status"] == "queued"
        assert run["waiting"] == {"reason": "disk", "limit": None, "active": None}, run
        assert [e["type"] for e in events(served, run_id)] == ["run.queued"]
    finally:
        filler.unlink()
    run = wait_status(served, run_id, {"succeeded", "failed", "lost", "cancelled"}, timeout=30)
    assert run["status"] == "succeeded", run
    assert terminal_events(served, run_id) == ["run.succeeded"]
