"""``qinglong serve`` started under a file-size limit (RLIMIT_FSIZE), as from a shell with
``ulimit -f`` or a systemd unit with LimitFSIZE, with SIGXFSZ at its default.

A job whose log grows past the limit ends with its own exit status and one terminal event
(never ``lost``): the log keeps its head up to the limit, the gap is recorded there. A job
that itself writes a file past the limit ends by SIGXFSZ, as it would outside the panel.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.e2e.conftest import ServeFactory
from tests.e2e.kit import enqueue, put_task, read_log, terminal_events, wait_status

pytestmark = pytest.mark.e2e

LIMIT = 2 << 20  # under the edge log quota (4 MiB): the limit cuts the log, not the quota
WRITTEN = 3 << 20
ENDED = {"succeeded", "failed", "lost", "cancelled", "timed_out"}


def test_jobs_under_a_panel_with_a_file_size_limit_end_with_their_own_status(
    serve_factory: ServeFactory, tmp_path: Path
) -> None:
    served = serve_factory(extra_env={"QL_PROFILE": "edge"}, file_size_limit=LIMIT)
    worker = served.service_pids()["worker"]
    assert f"Max file size             {LIMIT}" in Path(f"/proc/{worker}/limits").read_text()
    # The worker's own writes (database, receipts) fail EFBIG too: CPython ignores SIGXFSZ.
    status = dict(
        line.split(":\t") for line in Path(f"/proc/{worker}/status").read_text().splitlines()
    )
    assert int(status["SigIgn"], 16) >> (signal.SIGXFSZ - 1) & 1
    put_task(served, "chatty", f"head -c {WRITTEN} /dev/zero")
    put_task(served, "writer", f"exec head -c {WRITTEN} /dev/zero > out", tmp_path)

    chatty = enqueue(served, "chatty")
    run = wait_status(served, chatty, ENDED, timeout=60)
    attempt = run["latest_attempt"]
    assert (run["status"], attempt["exit_code"], attempt["signal"]) == ("succeeded", 0, None)
    assert terminal_events(served, chatty) == ["run.succeeded"]
    log = attempt["log"]
    assert (log["bytes"], log["truncated"], log["dropped_bytes"]) == (LIMIT, True, WRITTEN - LIMIT)
    assert (log["dropped_at"], log["truncation_reason"]) == (LIMIT, "write_error")
    assert read_log(served, chatty) == bytes(LIMIT)

    writer = enqueue(served, "writer")
    run = wait_status(served, writer, ENDED, timeout=60)
    attempt = run["latest_attempt"]
    assert (run["status"], attempt["signal"], attempt["exit_code"]) == (
        "failed",
        signal.SIGXFSZ,
        None,
    )
    assert terminal_events(served, writer) == ["run.failed"]
    assert (tmp_path / "out").stat().st_size == LIMIT
