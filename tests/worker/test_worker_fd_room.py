"""The worker's open-file room for QL_MAX_RUNNING (app/cli/worker.py), with a real
``qinglong worker``: it holds one pidfd a running shim, so under the usual soft limit of
1024 a QL_MAX_RUNNING near it left launches failing with EMFILE. The worker raises its
soft limit when short (never above the hard one, and not at all when it fits), and says in
one line when the hard limit is too low."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from app.worker.launcher import read_status
from tests.worker.kit import Worker


def _soft_limit(pid: int) -> int:
    line = next(ln for ln in Path(f"/proc/{pid}/limits").read_text().splitlines()
                if ln.startswith("Max open files"))  # fmt: skip
    return int(line.split()[3])


@pytest.mark.parametrize(
    ("max_running", "nofile", "soft_after", "warned"),
    [
        ("1000", (200, 4096), 1256, False),  # raised to fit, below the hard limit
        ("1000", (200, 300), 300, True),  # the hard limit is too low: raised to it, and said
        ("8", (400, 4096), 400, False),  # fits already: left as it is (jobs inherit it)
    ],
)
def test_the_worker_makes_room_for_a_pidfd_per_running_shim(
    db_url: str, tmp_path: Path, short_dir: Path, max_running: str, nofile: tuple[int, int],
    soft_after: int, warned: bool,
) -> None:  # fmt: skip
    worker = Worker(tmp_path, db_url, short_dir / "w.sock")
    worker.env["QL_MAX_RUNNING"] = max_running
    try:
        worker.start(nofile=nofile)
        assert worker.proc is not None
        assert _soft_limit(worker.proc.pid) == soft_after
    finally:
        worker.close()
    said = [ln for ln in worker.stderr().splitlines() if "needs about" in ln]
    assert bool(said) == warned, worker.stderr()
    if warned:
        assert "QL_MAX_RUNNING=1000 needs about 1256 open files" in said[0]
        assert "hard limit (RLIMIT_NOFILE) is 300" in said[0]


def test_a_status_line_is_read_from_a_descriptor_past_1023() -> None:
    """select() refuses a descriptor number past 1023 (ValueError, read as 'no status
    line'): every launch of a worker with that many files open failed."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1600:
        pytest.skip(f"the hard open-file limit ({hard}) leaves no descriptor past 1023")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1600), hard))
    r, w = os.pipe()
    high = 1500
    try:
        os.dup2(r, high)
        os.write(w, b'{"ok": true}\n')
        assert read_status(high, deadline=time.monotonic() + 5) == {"ok": True}
    finally:
        for fd in (r, w, high):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
