"""Shim: start-up time and RSS vs /bin/sh and a bare posix_spawn; log drain MB/s vs a shell.

The shim is started exactly as the worker starts it, without the worker or a database, so
only the shim is measured: one-shot (``shim_argv()``, spec on stdin, status line on stdout)
and forked by the zygote (``shim.py --zygote``, the worker's default). The zygote's
fd count and VmRSS are read before and after 500 launches (it must keep nothing per launch).
Where the host has a writable cgroup v2 hierarchy, start-up with a job cgroup too: the job
born there by clone3, beside the fallback that moves the shim in and back (the spec's
``no_clone3`` test hook) and beside no cgroup, interleaved and spaced out (docs/leftovers.md).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from app.domain.ids import uuid7
from app.worker.cgroups import AUTO, detect
from app.worker.identity import wait_exit
from app.worker.launcher import read_status, shim_argv
from app.worker.zygote import Zygote
from bench.report import Figure, Report, median
from bench.trivial import bare_spawn_ms

STATUS_TIMEOUT_S = 10.0  # a launch that says nothing by then fails the bench, never hangs it
# Between the cgroup start-up launches: a cgroup migration waits out an RCU grace period,
# which back-to-back migrations share, so only spaced launches show what one launch pays.
CGROUP_SPACING_S = 0.05
OVER_QUOTA_BYTES = 3_000_000  # a job's output past a 1 MiB quota, for the shim's USS then


class _Shims:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.receipts = root / "r"
        self.receipts.mkdir(mode=0o700)
        self.n = 0

    def spec(self, argv: list[str], quota: int, **over: Any) -> dict[str, Any]:
        self.n += 1
        log = self.root / f"job{self.n}.log"
        os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        attempt = uuid7()
        return {
            "protocol": 1, "run_id": uuid7(), "attempt_id": attempt, "callback_sequence": 1,
            "token": secrets.token_urlsafe(32), "argv": argv, "cwd": None,
            "env": {"PATH": "/usr/bin:/bin"}, "log_path": str(log), "log_quota_bytes": quota,
            "receipt_dir": str(self.receipts), "receipt_name": f"{attempt}.json",
            "leftovers": "kill", "cgroup_root": None, **over,
        }  # fmt: skip

    def launch(
        self, argv: list[str], quota: int = 1 << 20, **over: Any
    ) -> tuple[float, dict[str, Any]]:
        """(ms until the status line, status) of one shim launch (``over``: spec keys)."""
        payload = json.dumps(self.spec(argv, quota, **over)).encode()
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            shim_argv(), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/", env={},
            close_fds=True, start_new_session=True,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(payload)
        proc.stdin.close()
        try:
            status = read_status(proc.stdout.fileno(), time.monotonic() + STATUS_TIMEOUT_S)
            elapsed = (time.perf_counter() - t0) * 1000
        finally:
            proc.stdout.close()
            proc.wait(STATUS_TIMEOUT_S)
        if not status.get("ok"):
            raise RuntimeError(f"shim failed: {status}")
        return elapsed, status


    def zygote_launch(
        self, zygote: Zygote, argv: list[str], quota: int = 1 << 20
    ) -> tuple[float, dict[str, Any]]:
        """(ms until the status line, status) of one launch forked by ``zygote``."""
        payload = json.dumps(self.spec(argv, quota)).encode()
        t0 = time.perf_counter()
        read_fd, write_fd = os.pipe()
        try:
            first = zygote.spawn(payload, write_fd)
        finally:
            os.close(write_fd)
        try:
            status = read_status(read_fd, time.monotonic() + STATUS_TIMEOUT_S)
            elapsed = (time.perf_counter() - t0) * 1000
        finally:
            os.close(read_fd)
            zygote.release(first)
        if not status.get("ok"):
            raise RuntimeError(f"shim failed: {status}")
        return elapsed, status


def _proc_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


def _zygote_figures(report: Report, shims: _Shims, count: int, exec_ms: float) -> None:
    zygote = Zygote(argv=shim_argv(), reply_timeout_s=10.0)
    try:
        samples = []
        for _ in range(count):
            ms, status = shims.zygote_launch(zygote, ["/bin/true"])
            samples.append(ms)
            wait_exit(status["shim_pid"], 10)
        pid = zygote.pid
        assert pid is not None
        fds0, rss0 = len(os.listdir(f"/proc/{pid}/fd")), _proc_kb(pid, "VmRSS")
        for _ in range(500):
            _, status = shims.zygote_launch(zygote, ["/bin/true"])
            wait_exit(status["shim_pid"], 10)
        fds1, rss1 = len(os.listdir(f"/proc/{pid}/fd")), _proc_kb(pid, "VmRSS")
        report.add(Figure("shim start-up via zygote (request -> status line)", median(samples),
                          "ms", "one-shot shim start-up (this run)", exec_ms, False,
                          extra={"n": count}))
        report.add(Figure("zygote VmRSS after 500 more launches", rss1 / 1024, "MiB",
                          "zygote VmRSS before", rss0 / 1024, False,
                          extra={"fds_before": fds0, "fds_after": fds1}))
        report.add(Figure("zygote open fds after 500 more launches", fds1, "fds",
                          "zygote open fds before", fds0, False))
        _shim_uss_pss(report, shims, zygote)
    finally:
        zygote.close()


def _cgroup_figures(report: Report, shims: _Shims, count: int) -> None:
    """One-shot start-up with a job cgroup: clone3 against the fallback and against none."""
    root = detect(AUTO)
    if root is None:
        print("no writable cgroup v2 hierarchy here: no job-cgroup start-up figures")
        return
    ways: list[tuple[str, dict[str, Any]]] = [
        ("clone3", {"cgroup_root": str(root.path)}),
        ("migrate", {"cgroup_root": str(root.path), "test_hook": "no_clone3"}),
        ("none", {}),
    ]
    samples: dict[str, list[float]] = {way: [] for way, _ in ways}
    for i in range(count):
        for way, over in ways[i % 3 :] + ways[: i % 3]:  # each way first in turn
            ms, status = shims.launch(["/bin/true"], **over)
            if (status["cgroup"] is None) != (way == "none"):
                raise RuntimeError(f"{way}: unexpected job cgroup {status['cgroup']}")
            samples[way].append(ms)
            wait_exit(status["shim_pid"], 10)  # the job's cgroup is removed by then
            time.sleep(CGROUP_SPACING_S)
    clone3 = median(samples["clone3"])
    report.add(Figure("shim start-up, job cgroup by clone3", clone3, "ms",
                      "the same, shim moved in and back", median(samples["migrate"]), False,
                      extra={"n": count, "spacing_s": CGROUP_SPACING_S}))
    report.add(Figure("shim start-up, job cgroup by clone3", clone3, "ms",
                      "the same without a job cgroup", median(samples["none"]), False))


def _rollup_kb(pid: int) -> dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` in kB: Pss, and USS as Private_Clean + Private_Dirty."""
    got: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            got[key] = int(rest.split()[0])
    uss = got.get("Private_Clean", 0) + got.get("Private_Dirty", 0)
    return {"pss": got.get("Pss", -1), "uss": uss}


def _shim_uss_pss(report: Report, shims: _Shims, zygote: Zygote) -> None:
    """What one more running job costs in shim memory: USS (its own pages) and PSS.

    RSS counts the pages a zygote-forked shim shares with the zygote (the interpreter and
    its imports), so it overstates the cost of each further job; USS is what the kernel
    would free if that shim exited. Beside ``/bin/sh -c 'sleep; true'`` started the same way.
    """
    _, status = shims.zygote_launch(zygote, ["/bin/sleep", "5"])
    try:
        time.sleep(0.3)
        shim = _rollup_kb(status["shim_pid"])
    finally:
        os.kill(status["pid"], 9)
        wait_exit(status["shim_pid"], 10)
    pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "sleep 5; true"], {"PATH": "/usr/bin:/bin"})
    try:
        time.sleep(0.2)
        sh = _rollup_kb(pid)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    report.add(Figure("zygote-forked shim USS (running job)", shim["uss"] / 1024, "MiB",
                      "/bin/sh -c 'sleep; true' USS", sh["uss"] / 1024, False,
                      target="<= 2 MiB", extra={"shim_kB": shim, "sh_kB": sh}))
    report.add(Figure("zygote-forked shim PSS (running job)", shim["pss"] / 1024, "MiB",
                      "/bin/sh -c 'sleep; true' PSS", sh["pss"] / 1024, False))
    # Past its quota the shim holds the output's last bytes (64 KiB at most) until the end.
    over = f"head -c {OVER_QUOTA_BYTES} /dev/zero; exec sleep 5"
    _, status = shims.zygote_launch(zygote, ["/bin/sh", "-c", over], quota=1 << 20)
    try:
        log = Path(shims.root / f"job{shims.n}.log")
        deadline = time.monotonic() + 10
        while log.stat().st_size < (1 << 20) - 64 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # the rest of the output drained into the tail meanwhile
        full = _rollup_kb(status["shim_pid"])
    finally:
        os.kill(status["pid"], 9)
        wait_exit(status["shim_pid"], 10)
    report.add(Figure("zygote-forked shim USS (job past its 1 MiB quota)", full["uss"] / 1024,
                      "MiB", "the same, job under its quota", shim["uss"] / 1024, False,
                      target="<= 2 MiB", extra={"shim_kB": full, "output_bytes": OVER_QUOTA_BYTES}))


def _timed_run(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


def _hwm_kb(pid: int) -> int:
    return _proc_kb(pid, "VmHWM")


def _rss_of_running(argv: list[str]) -> int:
    """VmHWM (kB) of a process started with posix_spawn, read while it sleeps."""
    pid = os.posix_spawn(argv[0], argv, {"PATH": "/usr/bin:/bin"})
    try:
        time.sleep(0.2)
        return _hwm_kb(pid)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def run_shim(report: Report, *, count: int, drain_bytes: int) -> None:
    """Add the start-up, RSS and drain figures."""
    root = Path(tempfile.mkdtemp(prefix="qlb"))
    shims = _Shims(root)
    try:
        startup = []
        for _ in range(count):
            ms, status = shims.launch(["/bin/true"])
            startup.append(ms)
            wait_exit(status["shim_pid"], 10)
        sh = median([_timed_run(["/bin/sh", "-c", "true"]) for _ in range(count)])
        bare = median(bare_spawn_ms(count))
        report.add(Figure("shim start-up (spawn -> status line)", median(startup), "ms",
                          "/bin/sh -c true start+exit", sh, False, extra={"n": count}))
        report.add(Figure("shim start-up (spawn -> status line)", median(startup), "ms",
                          "posix_spawn /bin/true + wait", bare, False, extra={"n": count}))
        _zygote_figures(report, shims, count, median(startup))
        _cgroup_figures(report, shims, count)

        _, status = shims.launch(["/bin/sleep", "5"])
        try:
            time.sleep(0.2)
            shim_kb = _hwm_kb(status["shim_pid"])
        finally:
            os.kill(status["pid"], 9)  # the job leads its own group; the shim then finishes
            wait_exit(status["shim_pid"], 10)
        sh_kb = _rss_of_running(["/bin/sh", "-c", "sleep 5; true"])
        bare_kb = _rss_of_running(["/bin/sleep", "5"])
        report.add(Figure("long-lived shim VmHWM", shim_kb / 1024, "MiB",
                          "/bin/sh -c 'sleep; true' VmHWM", sh_kb / 1024, False,
                          target="next to /bin/sh", extra={"shim_kB": shim_kb, "sh_kB": sh_kb}))
        report.add(Figure("long-lived shim VmHWM", shim_kb / 1024, "MiB",
                          "bare posix_spawn /bin/sleep VmHWM", bare_kb / 1024, False))

        mb = drain_bytes / 1e6
        t0 = time.perf_counter()
        _, status = shims.launch(["/usr/bin/head", "-c", str(drain_bytes), "/dev/zero"],
                                 quota=drain_bytes + (1 << 20))
        wait_exit(status["shim_pid"], 120)
        shim_s = time.perf_counter() - t0
        out = root / "shell.out"
        shell_s = _timed_run(
            ["/bin/sh", "-c", f"cat /dev/zero | head -c {drain_bytes} > {out}; sync -f {out}"]
        ) / 1000
        report.add(Figure("shim log drain (under quota, fsync)", mb / shim_s, "MB/s",
                          "cat /dev/zero | head -c > file; sync", mb / shell_s, True,
                          extra={"bytes": drain_bytes}))
    finally:
        shutil.rmtree(root, ignore_errors=True)
