"""The shim started by its fork server (``shim.py --zygote``): the central cases of
test_shim.py again, plus what only the zygote has (fd/RSS hygiene, EOF exit, worker death).

The zygote is driven by the worker's own client (``app.worker.zygote.Zygote``); the status
line is read from the pipe whose write end travelled to the zygote, as the launcher does.
"""

from __future__ import annotations

import json
import os
import py_compile
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.domain.receipt import decode_receipt, encode_receipt
from app.worker.identity import current_boot_id, read_identity, wait_exit
from app.worker.launcher import shim_argv
from app.worker.zygote import Zygote
from tests.integration.conftest import Launched
from tests.integration.kit import (
    DEADLINE,
    SHIM,
    STATUS_KEYS,
    fd_targets,
    make_spec,
    poll_until,
    ppid,
    proc_state,
    receipt_path,
    wait_shim_done,
    zlaunch,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    server = Zygote(argv=shim_argv(shim_path=SHIM), reply_timeout_s=DEADLINE)
    try:
        yield server
    finally:
        server.close()


def zrun(zygote: Zygote, tmp_path: Path, argv: list[str], launched: Launched, **over: Any) -> Any:
    spec = make_spec(tmp_path, argv, **over)
    status = zlaunch(zygote, spec, launched)
    assert status["ok"] is True, status
    wait_shim_done(status)
    return spec, status, decode_receipt(receipt_path(spec).read_bytes())


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _proc_kb(pid: int, name: str, key: str) -> int:
    """A kB figure of ``/proc/<pid>/<name>`` (``status``, ``smaps_rollup``)."""
    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in {name}")


def _rss_kb(pid: int) -> int:
    return _proc_kb(pid, "status", "VmRSS")


def test_end_to_end_and_receipt_published(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    spec, status, receipt = zrun(
        zygote, tmp_path, ["/bin/sh", "-c", "echo out; echo err >&2; pwd; exit 3"], launched
    )
    assert set(status) == STATUS_KEYS and status["boot_id"] == current_boot_id()
    assert status["pgid"] == status["pid"] != status["shim_pid"]
    assert (tmp_path / "job.log").read_bytes() == f"out\nerr\n{tmp_path}\n".encode()
    assert receipt.exit_code == 3 and receipt.token == spec["token"]
    assert receipt_path(spec).read_bytes() == encode_receipt(receipt)
    assert sorted(p.name for p in Path(spec["receipt_dir"]).iterdir()) == [spec["receipt_name"]]


def test_own_session_and_not_a_child_of_the_zygote(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"])
    status = zlaunch(zygote, spec, launched)
    job, shim = status["pid"], status["shim_pid"]
    assert os.getpgid(job) == job
    assert os.getsid(job) == os.getsid(shim) != os.getsid(0)
    assert os.getsid(shim) != os.getsid(zygote.pid or 0)
    assert ppid(shim) not in (os.getpid(), zygote.pid)
    (tmp_path / "go").touch()
    wait_shim_done(status)


def test_status_line_carries_no_user_content(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    spec = make_spec(tmp_path, ["/bin/echo", "ARGV-MARKER"], env={"K": "ENV-MARKER"})
    text = json.dumps(zlaunch(zygote, spec, launched))
    for secret in ("ARGV-MARKER", "ENV-MARKER", spec["token"], str(tmp_path)):
        assert secret not in text


def test_environment_is_exactly_the_spec_env(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    env = {"ALPHA": "1", "BETA": "two words", "EMPTY": ""}
    spec, _status, receipt = zrun(zygote, tmp_path, ["/usr/bin/env"], launched, env=env)
    assert receipt.exit_code == 0
    lines = Path(spec["log_path"]).read_text().splitlines()
    assert sorted(lines) == sorted(f"{k}={v}" for k, v in env.items())


def test_job_has_only_stdio_fds(tmp_path: Path, launched: Launched, zygote: Zygote) -> None:
    spec, _status, receipt = zrun(zygote, tmp_path, ["/bin/ls", "-l", "/proc/self/fd/"], launched)
    assert receipt.exit_code == 0
    targets = fd_targets(spec["log_path"])
    assert set(targets) <= {0, 1, 2, 3}, targets  # 3: the directory ls opened itself
    assert targets.get(3, "/proc/").startswith("/proc/")
    assert targets[0] == "/dev/null"
    assert targets[1] == targets[2] and targets[1].startswith("pipe:")


def test_long_lived_shim_holds_no_zygote_or_worker_fd(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"])
    status = zlaunch(zygote, spec, launched)
    fds = {int(n): os.readlink(f"/proc/{status['shim_pid']}/fd/{n}")
           for n in os.listdir(f"/proc/{status['shim_pid']}/fd")}  # fmt: skip
    assert not [t for t in fds.values() if t.startswith("socket:")], fds
    assert fds[0] == fds[1] == fds[2] == "/dev/null"
    # Left: the log and its directory, the receipt directory and the receipt's reserved
    # temp file, the job's pipe read end and (soon) its pidfd.
    others = [t for fd, t in fds.items() if fd > 2]
    reserved = str(Path(spec["receipt_dir"]) / f".{spec['receipt_name']}.tmp")
    ours = (spec["log_path"], str(tmp_path), spec["receipt_dir"], reserved)
    assert all(t in others for t in ours), others
    rest = [t for t in others if t not in ours]
    assert [t for t in rest if t.startswith("pipe:")] and len(rest) <= 2, others
    assert all(t.startswith("pipe:") or t == "anon_inode:[pidfd]" for t in rest), others
    (tmp_path / "go").touch()
    wait_shim_done(status)


def test_quota_truncates_log_and_keeps_exit_code(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    quota = 1 << 20
    spec, _status, receipt = zrun(
        zygote, tmp_path, ["/bin/sh", "-c", "head -c 5000000 /dev/zero; exit 7"], launched,
        log_quota_bytes=quota,
    )  # fmt: skip
    assert receipt.exit_code == 7
    assert os.stat(spec["log_path"]).st_size == quota
    assert Path(spec["log_path"] + ".truncated").read_bytes() == (
        b'{"droppedBytes":%d,"gapAt":%d,"quotaBytes":%d,"reason":"quota","schemaVersion":1}'
        % (5_000_000 - quota, quota - 64 * 1024, quota)
    )


def test_failures_report_like_the_one_shot_shim(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    spec = make_spec(tmp_path, ["/nonexistent/program"])
    assert zlaunch(zygote, spec, launched) == {"ok": False, "error": "EXEC_FAILED", "errno": 2}
    assert zlaunch(zygote, b"not json", launched) == {
        "ok": False, "error": "SPEC_INVALID", "errno": None,
    }  # fmt: skip
    big = json.dumps({**spec, "token": "x" * (1 << 20)}).encode()
    assert zlaunch(zygote, big, launched)["error"] == "SPEC_INVALID"
    assert list(Path(spec["receipt_dir"]).iterdir()) == []
    # The zygote itself is unharmed by bad requests.
    (tmp_path / "ok").mkdir()
    _spec, status, receipt = zrun(zygote, tmp_path / "ok", ["/bin/true"], launched)
    assert status["ok"] and receipt.exit_code == 0


def test_zygote_keeps_no_fds_or_memory_per_launch(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    def batch(n: int, tag: str) -> None:
        statuses = []
        for i in range(n):
            sub = tmp_path / f"{tag}{i}"
            sub.mkdir()
            statuses.append(zlaunch(zygote, make_spec(sub, ["/bin/true"]), launched))
        for status in statuses:
            wait_shim_done(status)

    batch(20, "warm")  # allocator arenas settle; the zygote starts on the first launch
    pid = zygote.pid
    assert pid is not None

    # Every released first shim process was reaped: the zygote's one child left is the
    # first process of its spare, exited (a zombie pinning the spare's session id). The
    # zygote forks that spare after its reply, so its descriptors are counted once it has.
    def only_the_spare() -> bool:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return len(children) == 1 and proc_state(int(children[0])) == "Z"

    def settled_fds() -> int:
        poll_until(only_the_spare)
        counts = [_fd_count(pid)]
        while len(counts) < 3 or counts[-1] != counts[-2]:  # the zygote idle: nothing moves
            assert len(counts) < 50, counts
            time.sleep(0.05)
            counts.append(_fd_count(pid))
        return counts[-1]

    fds, rss = settled_fds(), _rss_kb(pid)
    batch(200, "n")
    assert zygote.pid == pid  # the same zygote served every launch
    assert settled_fds() == fds
    assert _rss_kb(pid) - rss < 2048, (rss, _rss_kb(pid))


def _session_members(sid: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[3]) == sid and int(name) != sid:
                members.append(int(name))
    return members


def _spare(zygote: Zygote) -> tuple[int, int]:
    """(first process, waiting shim) of the zygote's spare, once it is ready."""
    pid = zygote.pid
    assert pid is not None
    found: list[tuple[int, int]] = []

    def ready() -> bool:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        firsts = [int(c) for c in children if proc_state(int(c)) == "Z"]
        shims = [m for f in firsts for m in _session_members(f)]
        if len(firsts) == 1 and len(shims) == 1:
            found.append((firsts[0], shims[0]))
        return bool(found)

    poll_until(ready)
    return found[0]


def _spare_after_a_launch(zygote: Zygote, tmp_path: Path, launched: Launched) -> tuple[int, int]:
    (tmp_path / "a").mkdir()
    zrun(zygote, tmp_path / "a", ["/bin/true"], launched)
    return _spare(zygote)


def test_the_next_launch_is_served_by_a_spare_forked_before_it(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    first, shim = _spare_after_a_launch(zygote, tmp_path, launched)
    assert ppid(shim) != zygote.pid and os.getsid(shim) == first != os.getsid(0)
    fds = {int(n): os.readlink(f"/proc/{shim}/fd/{n}") for n in os.listdir(f"/proc/{shim}/fd")}
    assert fds[0] == fds[1] == fds[2] == "/dev/null"
    assert [t for fd, t in fds.items() if fd > 2] == [fds[max(fds)]], fds
    assert fds[max(fds)].startswith("socket:")  # one: its end of the zygote's socketpair
    (tmp_path / "b").mkdir()
    gate = tmp_path / "b" / "go"
    spec = make_spec(
        tmp_path / "b", ["/bin/sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; exit 6"]
    )
    status = zlaunch(zygote, spec, launched)
    assert status["ok"] is True and status["shim_pid"] == shim  # the spare, in its session
    held = [os.readlink(f"/proc/{shim}/fd/{n}") for n in os.listdir(f"/proc/{shim}/fd")]
    assert not [t for t in held if t.startswith("socket:")], held  # the spec's socket closed
    gate.touch()
    wait_shim_done(status)
    assert decode_receipt(receipt_path(spec).read_bytes()).exit_code == 6


def test_a_dead_spare_is_replaced_and_the_launch_goes_on(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    first, shim = _spare_after_a_launch(zygote, tmp_path, launched)
    pidfd = os.pidfd_open(shim)  # not our child: pinned by its pidfd before the signal
    try:
        assert os.getsid(shim) == first
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)
    assert wait_exit(shim, DEADLINE)
    (tmp_path / "b").mkdir()
    _spec, status, receipt = zrun(zygote, tmp_path / "b", ["/bin/sh", "-c", "exit 4"], launched)
    assert receipt.exit_code == 4 and status["shim_pid"] != shim
    assert _spare(zygote)[0] != first  # a fresh spare, and the dead one's first was reaped
    pid = zygote.pid
    assert pid is not None
    poll_until(lambda: str(first) not in Path(f"/proc/{pid}/task/{pid}/children").read_text())


def test_the_spare_ends_with_the_zygote(tmp_path: Path, launched: Launched, zygote: Zygote) -> None:
    _first, shim = _spare_after_a_launch(zygote, tmp_path, launched)
    zygote.close()
    assert wait_exit(shim, DEADLINE), "the spare outlived its zygote"


def test_zygote_exits_on_eof_and_running_shims_go_on(
    tmp_path: Path, launched: Launched, zygote: Zygote
) -> None:
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"])
    status = zlaunch(zygote, spec, launched)
    pid = zygote.pid
    assert pid is not None
    zygote.close()
    assert wait_exit(pid, DEADLINE)
    assert read_identity(status["shim_pid"]) is not None
    (tmp_path / "go").touch()
    wait_shim_done(status)
    assert decode_receipt(receipt_path(spec).read_bytes()).exit_code == 0


_WORKER = r"""
import json, os, sys, time
from app.worker.zygote import Zygote
z = Zygote(argv=[sys.executable, "-I", "-S", sys.argv[1]], reply_timeout_s=20.0)
r, w = os.pipe()
first = z.spawn(sys.stdin.buffer.read(), w)
os.close(w)
line = os.read(r, 4096)
z.release(first)
status = json.loads(line)
status["zygote_pid"] = z.pid
sys.stdout.write(json.dumps(status) + "\n"); sys.stdout.flush()
time.sleep(600)
"""


def test_worker_sigkill_ends_the_zygote_but_not_the_shim(
    tmp_path: Path, launched: Launched
) -> None:
    spec = make_spec(
        tmp_path,
        ["/bin/sh", "-c", "echo started; while [ ! -e go ]; do sleep 0.02; done; exit 5"],
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, SHIM], cwd=ROOT, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert worker.stdin is not None and worker.stdout is not None
    try:
        worker.stdin.write(json.dumps(spec).encode())
        worker.stdin.close()
        status = json.loads(_read_line_until_newline(worker.stdout.fileno()))
        launched.track_status(status)
        assert status["ok"] is True
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=DEADLINE)
        worker.stdout.close()
    assert wait_exit(status["zygote_pid"], DEADLINE), "the zygote outlived its worker"
    assert read_identity(status["shim_pid"]) is not None
    assert read_identity(status["pid"]) is not None
    (tmp_path / "go").touch()
    wait_shim_done(status)
    assert decode_receipt(receipt_path(spec).read_bytes()).exit_code == 5
    assert Path(spec["log_path"]).read_bytes() == b"started\n"


def _read_line_until_newline(fd: int) -> bytes:
    deadline = time.monotonic() + DEADLINE
    out = b""
    while b"\n" not in out:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "no line in time"
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, "closed before a line"
            out += chunk
    return out


def _shim_copy(tmp_path: Path) -> Path:
    """The shim in a directory of its own, so its ``__pycache__`` is this test's alone."""
    copy = tmp_path / "bin" / "shim.py"
    copy.parent.mkdir()
    copy.write_bytes(Path(SHIM).read_bytes())
    return copy


def test_the_zygote_runs_from_cached_bytecode_and_holds_less_memory_than_a_script(
    tmp_path: Path, launched: Launched
) -> None:
    """``shim_argv`` starts the shim from its ``__pycache__`` bytecode (written by the first
    start when the directory is writable; a script start never writes it): a script compiled
    at every start left the compiler's memory in the zygote, which every fork of it maps and
    tears down again (3.4 MiB on CPython 3.11; 256 KiB is asked, as other versions and
    allocators keep less of it)."""
    copy = _shim_copy(tmp_path)

    def anonymous_after_one_launch(argv: list[str], tag: str) -> int:
        server = Zygote(argv=argv, reply_timeout_s=DEADLINE)
        try:
            sub = tmp_path / tag
            sub.mkdir()
            status = zlaunch(server, make_spec(sub, ["/bin/true"]), launched)
            assert status["ok"] is True, status
            wait_shim_done(status)
            assert server.pid is not None
            return _proc_kb(server.pid, "smaps_rollup", "Anonymous")
        finally:
            server.close()

    anonymous_after_one_launch(shim_argv(shim_path=str(copy)), "first")
    assert list((copy.parent / "__pycache__").glob("shim.*.pyc")), "no bytecode was cached"
    booted = anonymous_after_one_launch(shim_argv(shim_path=str(copy)), "booted")
    script = anonymous_after_one_launch([sys.executable, "-I", "-S", str(copy)], "script")
    assert script - booted >= 256, (script, booted)


def test_a_corrupt_cached_bytecode_falls_back_to_the_source(
    tmp_path: Path, launched: Launched
) -> None:
    """A ``.pyc`` whose header is valid but whose body is not (a power cut mid-write on a
    file system without ordered data) must not stop every shim start: the boot compiles the
    source instead, as a script start would."""
    copy = _shim_copy(tmp_path)
    cached = Path(py_compile.compile(str(copy), doraise=True))  # what a first start writes
    data = cached.read_bytes()
    cached.write_bytes(data[:16] + b"\0" * (len(data) - 16))  # the header still matches the source
    server = Zygote(argv=shim_argv(shim_path=str(copy)), reply_timeout_s=DEADLINE)
    try:
        _spec, _status, receipt = zrun(server, tmp_path, ["/bin/true"], launched)
    finally:
        server.close()
    assert receipt.exit_code == 0
