"""The launcher's zygote path: restart after a dead zygote, never a second spawn when the
request may have been received, fallback to one-shot shims, concurrent launches, close."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.errors import LaunchFailed
from app.domain.model import ProcessHandle
from app.storage.journal_repo import SPAWN_FAILED, JournalRepository
from app.worker.identity import wait_exit
from app.worker.launcher import SHIM_PATH, ShimLauncher
from app.worker.receipts import ReceiptStore
from tests.worker.kit import Processes, armed_run, concurrently, launch_request, make_log

DEADLINE = 20.0


class Kit:
    def __init__(self, engine: Engine, root: Path) -> None:
        self.engine, self.root = engine, root
        self.journal = JournalRepository(engine)
        self.launchers: list[ShimLauncher] = []
        self.last_attempt = ""

    def launcher(self, **kw: object) -> ShimLauncher:
        launcher = ShimLauncher(
            journal=self.journal, receipts=ReceiptStore(self.root / "receipts"), mode="zygote",
            **kw,  # type: ignore[arg-type]
        )  # fmt: skip
        self.launchers.append(launcher)
        return launcher

    def launch(self, launcher: ShimLauncher, argv: list[str]) -> tuple[str, ProcessHandle]:
        armed = armed_run(self.engine)
        self.last_attempt = armed.attempt_id
        log = make_log(self.root / "logs", armed.attempt_id)
        return armed.attempt_id, launcher.launch(launch_request(armed, argv=argv, log_path=log))


@pytest.fixture
def kit(engine: Engine, tmp_path: Path) -> Iterator[Kit]:
    k = Kit(engine, tmp_path)
    try:
        yield k
    finally:
        for launcher in k.launchers:
            launcher.close()


def test_a_dead_zygote_is_restarted_and_the_launch_proceeds(kit: Kit, procs: Processes) -> None:
    launcher = kit.launcher()
    _a, first = kit.launch(launcher, ["/bin/true"])
    procs.track(first)
    old = launcher.zygote_pid
    assert old is not None
    os.kill(old, signal.SIGKILL)  # our launcher's child: the pid is pinned until reaped
    assert wait_exit(old, DEADLINE)
    _b, second = kit.launch(launcher, ["/bin/true"])
    procs.track(second)
    assert launcher.zygote_pid not in (None, old)
    assert wait_exit(second.shim_pid, DEADLINE)


def test_no_reply_after_the_request_means_failure_not_a_second_spawn(
    kit: Kit, tmp_path: Path
) -> None:
    marker = tmp_path / "exec-shim-ran"
    fake = tmp_path / "fake_shim.py"
    # As a zygote: greets, swallows one request, dies without replying (it "may have
    # forked"). As a one-shot shim it would leave a marker: it must never be used then.
    fake.write_text(
        "import os, sys\n"
        "if sys.argv[1:2] == ['--zygote']:\n"
        "    os.write(0, b'Z1')\n"
        "    os.read(0, 1 << 16)\n"
        "    os._exit(0)\n"
        f"open({str(marker)!r}, 'w').close()\n"
    )
    launcher = kit.launcher(shim_path=str(fake), status_timeout_s=5.0)
    with pytest.raises(LaunchFailed) as info:
        kit.launch(launcher, ["/bin/true"])
    assert info.value.reason == "SHIM_NO_STATUS"
    assert not marker.exists()
    entry = kit.journal.get(kit.last_attempt)
    assert entry is not None and entry.state == SPAWN_FAILED


def test_a_zygote_that_cannot_start_falls_back_to_one_shot_shims(
    kit: Kit, tmp_path: Path, procs: Processes
) -> None:
    fake = tmp_path / "no_zygote_shim.py"
    real = Path(SHIM_PATH).read_text()
    serve = 'sys.exit(serve(sys.argv[2:]) if sys.argv[1:2] == ["--zygote"] else main())'
    assert serve in real
    fake.write_text(real.replace(serve, 'sys.exit(1 if sys.argv[1:2] == ["--zygote"] else main())'))
    launcher = kit.launcher(shim_path=str(fake))
    for _ in range(2):
        _a, handle = kit.launch(launcher, ["/bin/true"])
        procs.track(handle)
        assert wait_exit(handle.shim_pid, DEADLINE)
    assert launcher.zygote_pid is None


def test_concurrent_launches_through_one_zygote(kit: Kit, procs: Processes) -> None:
    launcher = kit.launcher()
    results = concurrently(6, lambda: kit.launch(launcher, ["/bin/true"])[1], timeout=DEADLINE)
    handles = [r for r in results if isinstance(r, ProcessHandle)]
    for h in handles:
        procs.track(h)
    assert len(handles) == 6, results
    assert len({h.pid for h in handles}) == 6
    for h in handles:
        assert wait_exit(h.shim_pid, DEADLINE)


def test_close_ends_the_zygote_and_leaves_the_job_running(
    kit: Kit, tmp_path: Path, procs: Processes
) -> None:
    launcher = kit.launcher()
    gate = tmp_path / "gate"
    _a, handle = kit.launch(
        launcher, ["/bin/sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]
    )
    procs.track(handle)
    pid = launcher.zygote_pid
    assert pid is not None
    launcher.close()
    assert wait_exit(pid, DEADLINE)
    assert not wait_exit(handle.pid, 0.0)
    gate.touch()
    assert wait_exit(handle.shim_pid, DEADLINE)
