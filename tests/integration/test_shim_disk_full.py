"""The shim on a real full disk (a 60 MiB tmpfs): the ending survives ENOSPC (docs/design.md §3.11).

The job writes, the disk fills while it writes, the job exits 7 on a full disk: nothing is
published while there is no room (never a half-written or empty file under a final name),
the shim keeps the ending, and once space returns the receipt says exit 7 and the
truncation fact counts every dropped byte with reason ``disk_full``. No temp file stays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from app.domain.receipt import decode_receipt
from app.worker.identity import wait_exit
from tests.disk import MIB, fill, mounted_tmpfs
from tests.integration.kit import (
    SHIM,
    make_spec,
    poll_until,
    read_status,
    receipt_path,
    wait_shim_done,
)

FIRST = MIB
THEN = 3_000_000


def _launch(spec: dict[str, object]) -> dict[str, object]:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", SHIM], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(spec).encode())
    proc.stdin.close()
    raw = read_status(proc.stdout.fileno(), time.monotonic() + 20)
    proc.stdout.close()
    proc.wait(timeout=20)
    status: dict[str, object] = json.loads(raw)
    return status


def _stat_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    return data[data.rindex(b")") + 2 :].split()[0].decode()


def test_a_job_ending_on_a_full_disk_is_published_with_its_exit_code_once_space_returns(
    tmp_path: Path,
) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    script = (
        f"head -c {FIRST} /dev/zero; while [ ! -e full ]; do sleep 0.01; done; "
        f"head -c {THEN} /dev/zero; touch wrote; while [ ! -e exit ]; do sleep 0.01; done; exit 7"
    )
    with mounted_tmpfs(tmp_path / "disk") as disk:
        spec = make_spec(
            disk, ["/bin/sh", "-c", script], cwd=str(gates), log_quota_bytes=64 * MIB
        )
        status = _launch(spec)
        assert status["ok"] is True, status
        shim_pid = int(status["shim_pid"])  # type: ignore[call-overload]
        try:
            log = Path(str(spec["log_path"]))
            poll_until(lambda: log.stat().st_size == FIRST)
            filler = fill(disk)
            (gates / "full").touch()
            poll_until(lambda: (gates / "wrote").exists())
            (gates / "exit").touch()
            time.sleep(1.5)  # the job has exited; the shim retries publication meanwhile
            receipts = Path(str(spec["receipt_dir"]))
            name = str(spec["receipt_name"])
            assert not receipt_path(spec).exists()
            assert not Path(f"{log}.truncated").exists()  # never visible empty
            assert [p.name for p in receipts.iterdir()] == [f".{name}.tmp"]
            assert _stat_state(shim_pid) in ("S", "R")  # alive, holding the ending
            filler.unlink()
            wait_shim_done(status)  # type: ignore[arg-type]
        finally:
            if not wait_exit(shim_pid, 0):
                os.kill(shim_pid, 9)
                wait_exit(shim_pid, 10)
        receipt = decode_receipt(receipt_path(spec).read_bytes())
        assert receipt.exit_code == 7 and receipt.signal is None
        fact = json.loads(Path(f"{log}.truncated").read_bytes())
        kept = log.stat().st_size
        assert kept < FIRST + THEN
        assert fact == {
            "droppedBytes": FIRST + THEN - kept,
            "gapAt": kept,  # the dropped bytes are the output's end: no tail after them
            "quotaBytes": 64 * MIB,
            "reason": "disk_full",
            "schemaVersion": 1,
        }
        assert [p.name for p in receipts.iterdir()] == [name]  # no temp left
        assert sorted(p.name for p in log.parent.iterdir() if p.name.startswith(".")) == []


def test_no_room_for_the_receipt_means_no_job_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with mounted_tmpfs(tmp_path / "disk") as disk:
        spec = make_spec(disk, ["/bin/sh", "-c", f"touch {marker}"])
        filler = fill(disk)
        try:
            status = _launch(spec)
        finally:
            filler.unlink()
        assert status == {"ok": False, "error": "RECEIPT_RESERVE_FAILED", "errno": 28}
        time.sleep(0.2)
        assert not marker.exists()
        assert list(Path(str(spec["receipt_dir"])).iterdir()) == []
