"""A spare's receipt reservation made ahead (launch-protocol.md §8 "Reservation made ahead").

The zygote knows the receipts root, so each spare creates ``.spare-<pid>-<ticks>.tmp`` there,
with its claim and the receipt's space, before any spec comes; the launch links it to the
attempt's temp name (the claim, refused like O_EXCL when the name is taken) instead of
creating a file on the way to the job. Real zygote, spares, jobs and files; the worker's
sweep removes what a spare killed while waiting left behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.domain.artifacts import shard_of
from app.domain.receipt import decode_receipt
from app.worker.identity import wait_exit
from app.worker.launcher import shim_argv
from app.worker.receipts import FENCE_MARK, ReceiptStore
from app.worker.zygote import Zygote
from tests.integration.conftest import Launched
from tests.integration.kit import (
    DEADLINE,
    SHIM,
    make_spec,
    poll_until,
    proc_state,
    read_status,
    wait_shim_done,
    zlaunch,
    zspawn,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "receipts"
    (path / "01").mkdir(parents=True, mode=0o700)
    path.chmod(0o700)
    return path


@pytest.fixture
def zygote(root: Path) -> Iterator[Zygote]:
    server = Zygote(
        argv=shim_argv(shim_path=SHIM), reply_timeout_s=DEADLINE, receipts_root=str(root)
    )
    try:
        yield server
    finally:
        server.close()


def _spec(tmp_path: Path, root: Path, argv: list[str]) -> dict[str, Any]:
    work = tmp_path / uuid.uuid4().hex
    work.mkdir()
    spec = make_spec(work, argv)
    spec["receipt_dir"] = str(root / "01")
    return spec


def _spares(root: Path) -> dict[int, Path]:
    """The root's reservations made ahead, by the pid in their name."""
    found = {}
    for path in root.glob(".spare-*-*.tmp"):
        pid = path.name.split("-")[1]
        if pid.isdigit():
            found[int(pid)] = path
    return found


def _one_spare(root: Path) -> tuple[int, Path]:
    found: list[tuple[int, Path]] = []

    def ready() -> bool:
        spares = _spares(root)
        if len(spares) == 1:
            (pid, path), = spares.items()
            head = path.read_bytes().rstrip(b"\0")
            if head:  # written: the spare waits for its spec
                found.append((pid, path))
        return bool(found)

    poll_until(ready)
    return found[0]


def _warm(zygote: Zygote, tmp_path: Path, root: Path, launched: Launched) -> None:
    """One launch, so that the zygote (and so its spare) runs."""
    status = zlaunch(zygote, _spec(tmp_path, root, ["/bin/true"]), launched)
    assert status["ok"] is True, status
    wait_shim_done(status)


def test_the_launch_links_the_spares_reservation_into_place(
    tmp_path: Path, root: Path, zygote: Zygote, launched: Launched
) -> None:
    _warm(zygote, tmp_path, root, launched)
    pid, ahead = _one_spare(root)
    claim = json.loads(ahead.read_bytes().rstrip(b"\0"))
    assert claim["shim_pid"] == pid and set(claim) == {"boot_id", "shim_pid", "shim_start_ticks"}
    assert ahead.stat().st_size == 4096 and (ahead.stat().st_mode & 0o777) == 0o600
    inode = ahead.stat().st_ino
    gate = tmp_path / "go"
    spec = _spec(tmp_path, root, ["/bin/sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])
    status = zlaunch(zygote, spec, launched)
    assert status["ok"] is True and status["shim_pid"] == pid
    # The reservation under the attempt's temp name is the very file made ahead, the claim
    # already in it; the spare's own name for it is gone.
    temp = root / "01" / f".{spec['receipt_name']}.tmp"
    assert temp.stat().st_ino == inode and temp.stat().st_nlink == 1
    assert json.loads(temp.read_bytes().rstrip(b"\0")) == claim
    assert pid not in _spares(root)
    gate.touch()
    wait_shim_done(status)
    receipt = decode_receipt((root / "01" / spec["receipt_name"]).read_bytes())
    assert receipt.exit_code == 0 and not temp.exists()
    _one_spare(root)  # the next spare made its own


def test_a_taken_name_refuses_the_reservation_made_ahead_and_nothing_runs(
    tmp_path: Path, root: Path, zygote: Zygote, launched: Launched
) -> None:
    _warm(zygote, tmp_path, root, launched)
    pid, ahead = _one_spare(root)
    marker = tmp_path / "ran"
    spec = _spec(tmp_path, root, ["/bin/sh", "-c", f"touch {marker}"])
    temp = root / "01" / f".{spec['receipt_name']}.tmp"
    temp.write_bytes(FENCE_MARK)  # recovery fenced the attempt before any shim reserved it
    status = zlaunch(zygote, spec, launched)
    assert status == {"ok": False, "error": "RECEIPT_RESERVE_FAILED", "errno": 17}
    assert temp.read_bytes() == FENCE_MARK  # never replaced, never removed by the shim
    assert not ahead.exists()  # the spare removed its own reservation
    assert wait_exit(pid, DEADLINE)
    time.sleep(0.2)
    assert not marker.exists()


def test_a_reservation_made_ahead_that_vanished_is_made_again_on_the_way(
    tmp_path: Path, root: Path, zygote: Zygote, launched: Launched
) -> None:
    _warm(zygote, tmp_path, root, launched)
    pid, ahead = _one_spare(root)
    ahead.unlink()  # e.g. a sweep took it while it was still empty
    spec = _spec(tmp_path, root, ["/bin/sh", "-c", "exit 3"])
    status = zlaunch(zygote, spec, launched)
    assert status["ok"] is True and status["shim_pid"] == pid
    wait_shim_done(status)
    assert decode_receipt((root / "01" / spec["receipt_name"]).read_bytes()).exit_code == 3


def test_an_unused_spare_removes_its_reservation_and_the_sweep_takes_a_dead_ones(
    tmp_path: Path, root: Path, zygote: Zygote, launched: Launched
) -> None:
    _warm(zygote, tmp_path, root, launched)
    pid, ahead = _one_spare(root)
    pidfd = os.pidfd_open(pid)  # not our child: pinned by its pidfd before the signal
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # killed while it waits for a spec
    finally:
        os.close(pidfd)
    assert wait_exit(pid, DEADLINE)
    assert ahead.exists()  # left behind
    (root / ".spare-not-ours.tmp").write_bytes(b"")  # not a spare's name: never touched
    _warm(zygote, tmp_path, root, launched)  # the dead spare is replaced by a live one

    def live_written() -> bool:  # its claim written: a file still empty would be swept too
        live = [path for p, path in _spares(root).items() if p != pid]
        return len(live) == 1 and bool(live[0].read_bytes().rstrip(b"\0"))

    poll_until(live_written)
    live_pid = next(p for p in _spares(root) if p != pid)
    assert ReceiptStore(root).sweep_spares() == 1
    assert not ahead.exists() and live_pid in _spares(root)
    assert (root / ".spare-not-ours.tmp").exists()
    zygote.close()  # EOF: the waiting spare ends and removes its own reservation
    assert wait_exit(live_pid, DEADLINE)
    assert _spares(root) == {}


def test_a_spare_that_refuses_its_spec_removes_its_reservation(
    tmp_path: Path, root: Path, zygote: Zygote, launched: Launched
) -> None:
    _warm(zygote, tmp_path, root, launched)
    pid, ahead = _one_spare(root)
    spec = _spec(tmp_path, root, ["/bin/true"])
    spec["log_path"] = str(tmp_path / "no-such-log")  # the shim opens, never creates, it
    status = zlaunch(zygote, spec, launched)
    assert status["ok"] is False and status["error"] == "LOG_OPEN_FAILED"
    assert wait_exit(pid, DEADLINE)
    assert not ahead.exists()
    assert not (root / "01" / f".{spec['receipt_name']}.tmp").exists()


def test_the_sweep_judges_only_plain_files_named_like_a_spares(tmp_path: Path, root: Path) -> None:
    """Worker start must survive whatever lies in the root: only plain files with a spare's
    name and no live shim's claim go; directories, symlinks and other names stay."""
    store = ReceiptStore(root)
    (root / ".spare-1-1.tmp").write_bytes(b"")  # never written: a spare that died at once
    (root / ".spare-2-2.tmp").write_bytes(b"not json")
    (root / ".spare-3-3.tmp").write_bytes(b"[" * 5000)  # deep nesting: no RecursionError
    (root / ".spare-4-4.tmp").mkdir()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x")
    (root / ".spare-5-5.tmp").symlink_to(target)
    (root / ".spare-x-6.tmp").write_bytes(b"")  # not a spare's name
    assert store.sweep_spares() == 3
    left = sorted(p.name for p in root.iterdir() if p.name.startswith(".spare"))
    assert left == [".spare-4-4.tmp", ".spare-5-5.tmp", ".spare-x-6.tmp"]
    assert target.read_bytes() == b"x"


def test_a_spare_killed_between_linking_and_dropping_its_name_started_nothing(
    tmp_path: Path, root: Path, zygote: Zygote, launched: Launched
) -> None:
    """The crash window inside the link: both names hold the claim, no job was started.
    Recovery reads the temp as a dead shim's claim (``shim_gone``: fail closed, as for any
    shim that died after reserving), and the worker's sweep removes the spare's name only."""
    _warm(zygote, tmp_path, root, launched)
    pid, ahead = _one_spare(root)
    marker = tmp_path / "ran"
    spec = _spec(tmp_path, root, ["/bin/sh", "-c", f"touch {marker}"])
    shard = root / shard_of(spec["attempt_id"])
    shard.mkdir(mode=0o700, exist_ok=True)
    spec["receipt_dir"] = str(shard)
    spec["test_hook"] = "stop_after_reserve_link"
    temp = shard / f".{spec['receipt_name']}.tmp"
    first, read_fd = zspawn(zygote, spec)
    try:
        poll_until(lambda: proc_state(pid) == "T")  # stopped by the hook, right after the link
        assert temp.stat().st_ino == ahead.stat().st_ino and temp.stat().st_nlink == 2
        pidfd = os.pidfd_open(pid)
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
        assert wait_exit(pid, DEADLINE)
        assert read_status(read_fd, time.monotonic() + DEADLINE) == b""  # no status line
    finally:
        os.close(read_fd)
        zygote.release(first)
    store = ReceiptStore(root)
    assert store.claim_reservation(spec["attempt_id"]) == "shim_gone"
    # The zygote forked its next spare after the reply; while that one is still writing its
    # reservation the sweep would take its empty file too (it then reserves the ordinary
    # way at its launch). Once written, its claim is alive and the sweep keeps it.
    nxt: list[int] = []

    def next_spare_written() -> bool:
        others = {p: f for p, f in _spares(root).items() if p != pid}
        if len(others) == 1 and all(f.read_bytes().rstrip(b"\0") for f in others.values()):
            nxt[:] = list(others)
        return bool(nxt)

    poll_until(next_spare_written)
    assert store.sweep_spares() == 1
    assert set(_spares(root)) == set(nxt)
    assert not ahead.exists() and temp.stat().st_nlink == 1
    assert json.loads(temp.read_bytes().rstrip(b"\0"))["shim_pid"] == pid
    time.sleep(0.2)
    assert not marker.exists()


