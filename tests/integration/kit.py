"""Shared by the shim's integration tests (one-shot and zygote): the spec, the status channel,
a launch through the zygote, the receipt's place and the job's open descriptors as
``ls -l /proc/self/fd`` lists them."""

from __future__ import annotations

import json
import os
import secrets
import select
import time
from pathlib import Path
from typing import Any

from app.domain.ids import uuid7
from app.worker.identity import stat_fields, wait_exit
from app.worker.zygote import Zygote
from tests.integration.conftest import Launched
from tests.kit.processes import proc_state as proc_state  # moved to the shared kit

SHIM = str(Path(__file__).resolve().parents[2] / "app" / "worker" / "shim.py")
DEADLINE = 20.0
STATUS_KEYS = {
    "ok", "boot_id", "shim_pid", "shim_start_ticks", "pid", "pgid", "start_ticks",
    "started_at_ms", "cgroup",
}


def make_spec(tmp_path: Path, argv: list[str], **over: Any) -> dict[str, Any]:
    log_path = tmp_path / "job.log"
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    receipts = tmp_path / "receipts" / "01"
    receipts.mkdir(parents=True, mode=0o700)
    attempt_id = uuid7()
    spec: dict[str, Any] = {
        "protocol": 1,
        "run_id": uuid7(),
        "attempt_id": attempt_id,
        "callback_sequence": 1,
        "token": secrets.token_urlsafe(32),
        "argv": argv,
        "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin"},
        "log_path": str(log_path),
        "log_quota_bytes": 1 << 20,
        "receipt_dir": str(receipts),
        "receipt_name": f"{attempt_id}.json",
        "leftovers": "kill",
        "cgroup_root": None,
    }
    spec.update(over)
    return spec


def read_status(fd: int, deadline: float) -> bytes:
    """Everything the shim writes on its status channel, up to EOF, within a bounded deadline."""
    out = b""
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "status line not received in time"
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return out
        out += chunk


def poll_until(condition: Any, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def wait_shim_done(status: dict[str, Any], timeout: float = DEADLINE) -> None:
    assert wait_exit(status["shim_pid"], timeout), "shim did not finish in time"


def receipt_path(spec: dict[str, Any]) -> Path:
    return Path(spec["receipt_dir"]) / spec["receipt_name"]


def fd_targets(log_path: str) -> dict[int, str]:
    """fd → target from a job's ``ls -l /proc/self/fd/`` output in its log."""
    targets = {}
    for line in Path(log_path).read_text().splitlines():
        if " -> " in line:
            name, target = line.split(" -> ")
            targets[int(name.split()[-1])] = target
    return targets


def ppid(pid: int) -> int:
    """The parent of the live process ``pid``."""
    fields = stat_fields(pid)
    assert fields is not None, f"no process {pid}"
    return int(fields[1])


def zspawn(zygote: Zygote, spec: dict[str, Any] | bytes) -> tuple[int, int]:
    """Hand ``spec`` to the zygote: (its first shim process, the status pipe's read end)."""
    payload = spec if isinstance(spec, bytes) else json.dumps(spec).encode()
    read_fd, write_fd = os.pipe()
    try:
        first = zygote.spawn(payload, write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return first, read_fd


def zlaunch(zygote: Zygote, spec: dict[str, Any] | bytes, launched: Launched) -> dict[str, Any]:
    """One launch through the zygote; the parsed status line (read to EOF)."""
    first, read_fd = zspawn(zygote, spec)
    try:
        raw = read_status(read_fd, time.monotonic() + DEADLINE)
    finally:
        os.close(read_fd)
        zygote.release(first)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1, raw
    status: dict[str, Any] = json.loads(raw)
    launched.track_status(status)
    return status


