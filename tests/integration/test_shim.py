"""The real shim end to end: spec in, status line out, log under quota, receipt published.

Every test starts real processes and tracks each job and shim it launched; the ``launched``
fixture stops every one that is still alive at teardown (by verified identity, never by
name). Waits are bounded polls on real conditions (pidfd readiness, file existence).
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.domain.receipt import decode_receipt, encode_receipt
from app.worker.identity import current_boot_id, read_identity, wait_exit
from app.worker.launcher import shim_argv
from tests.integration.conftest import Launched
from tests.integration.kit import (
    DEADLINE,
    SHIM,
    STATUS_KEYS,
    fd_targets,
    make_spec,
    poll_until,
    ppid,
    read_status,
    receipt_path,
    wait_shim_done,
)
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir


def launch(
    spec: dict[str, Any] | bytes, launched: Launched, *, file_size_limit: int | None = None
) -> dict[str, Any]:
    """Start the shim exactly as the worker does; return the parsed status line.
    ``file_size_limit``: no file may grow past it (RLIMIT_FSIZE), with SIGXFSZ at its default
    as a shell or a systemd unit (LimitFSIZE) leaves it: the shim must not die of it. CPython
    ignores SIGXFSZ from its start-up, so the shim's own ignore (app/worker/shim.py
    ``_run_shim``) is not what these tests can tell apart: they guard the behaviour."""
    payload = spec if isinstance(spec, bytes) else json.dumps(spec).encode()

    def limit_file_size() -> None:
        assert file_size_limit is not None
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, resource.RLIM_INFINITY))

    proc = subprocess.Popen(
        shim_argv(shim_path=SHIM),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
        env={},
        preexec_fn=None if file_size_limit is None else limit_file_size,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
        raw = read_status(proc.stdout.fileno(), time.monotonic() + DEADLINE)
    finally:
        proc.stdout.close()
        first_exit = proc.wait(timeout=DEADLINE)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1, raw
    status: dict[str, Any] = json.loads(raw)
    launched.track_status(status)
    assert first_exit == (0 if status["ok"] else first_exit)
    return status


def run_to_receipt(tmp_path: Path, argv: list[str], launched: Launched, **over: Any) -> Any:
    spec = make_spec(tmp_path, argv, **over)
    status = launch(spec, launched)
    assert status["ok"] is True, status
    wait_shim_done(status)
    receipt = decode_receipt(receipt_path(spec).read_bytes())
    return spec, status, receipt


# ---- happy path -----------------------------------------------------------------------


def test_end_to_end(tmp_path: Path, launched: Launched) -> None:
    before = time.time_ns() // 1_000_000
    spec, status, receipt = run_to_receipt(
        tmp_path, ["/bin/sh", "-c", "echo out; echo err >&2; pwd; exit 3"], launched
    )
    assert set(status) == STATUS_KEYS
    assert status["boot_id"] == current_boot_id()
    assert status["pgid"] == status["pid"] != status["shim_pid"]
    assert all(type(status[k]) is int for k in STATUS_KEYS - {"ok", "boot_id", "cgroup"})
    assert status["started_at_ms"] >= before
    assert (tmp_path / "job.log").read_bytes() == f"out\nerr\n{tmp_path}\n".encode()
    assert receipt.exit_code == 3 and receipt.signal is None
    assert receipt_path(spec).read_bytes() == encode_receipt(receipt)  # canonical bytes
    assert receipt.run_id == spec["run_id"] and receipt.attempt_id == spec["attempt_id"]
    assert receipt.token == spec["token"] and receipt.callback_sequence == 1
    assert receipt.started_at_ms == status["started_at_ms"] <= receipt.finished_at_ms
    # Published atomically: no temp file left, private mode, nothing else in the shard.
    assert sorted(p.name for p in Path(spec["receipt_dir"]).iterdir()) == [spec["receipt_name"]]
    assert receipt_path(spec).stat().st_mode & 0o777 == 0o600
    assert not Path(spec["log_path"] + ".truncated").exists()


def test_status_line_carries_no_user_content(tmp_path: Path, launched: Launched) -> None:
    spec = make_spec(tmp_path, ["/bin/echo", "ARGV-MARKER"], env={"K": "ENV-MARKER"})
    status = launch(spec, launched)
    text = json.dumps(status)
    for secret in ("ARGV-MARKER", "ENV-MARKER", spec["token"], str(tmp_path)):
        assert secret not in text
    wait_shim_done(status)


def test_a_log_over_its_quota_keeps_its_head_and_its_tail(
    tmp_path: Path, launched: Launched
) -> None:
    """The first lines and the last (where the error usually is), the bytes between dropped and
    counted exactly, the gap's offset in the fact; the exit code unchanged."""
    quota, lines = 100_000, 200_000
    spec, _status, receipt = run_to_receipt(
        tmp_path, ["/bin/sh", "-c", f"seq 1 {lines}; exit 7"], launched, log_quota_bytes=quota
    )
    assert receipt.exit_code == 7 and receipt.signal is None
    output = b"".join(b"%d\n" % i for i in range(1, lines + 1))
    tail = quota // 4  # a quarter of the quota (at most 64 KiB)
    log = Path(spec["log_path"]).read_bytes()
    assert log == output[: quota - tail] + output[-tail:]
    assert log.startswith(b"1\n2\n") and log.endswith(b"\n%d\n" % lines)
    fact_path = Path(spec["log_path"] + ".truncated")
    assert fact_path.stat().st_mode & 0o777 == 0o600
    assert fact_path.read_bytes() == (
        b'{"droppedBytes":%d,"gapAt":%d,"quotaBytes":%d,"reason":"quota","schemaVersion":1}'
        % (len(output) - quota, quota - tail, quota)
    )


def test_a_tail_the_log_takes_only_part_of_is_not_said_to_be_the_outputs_end(
    tmp_path: Path, launched: Launched
) -> None:
    """The ring went round, then the tail's write stops 50 bytes in (EFBIG): the log's last
    bytes are from the middle of the output, so the gap is its end; every byte counted."""
    quota, lines = 100_000, 200_000
    head, tail = quota - quota // 4, quota // 4
    spec = make_spec(
        tmp_path, ["/bin/sh", "-c", f"seq 1 {lines}; exit 7"], log_quota_bytes=quota
    )
    status = launch(spec, launched, file_size_limit=head + 50)
    assert status["ok"] is True, status
    wait_shim_done(status)
    receipt = decode_receipt(receipt_path(spec).read_bytes())  # published all the same
    assert receipt.exit_code == 7 and receipt.signal is None
    output = b"".join(b"%d\n" % i for i in range(1, lines + 1))
    log = Path(spec["log_path"]).read_bytes()
    assert log == output[:head] + output[-tail:][:50]
    assert Path(spec["log_path"] + ".truncated").read_bytes() == (
        b'{"droppedBytes":%d,"gapAt":%d,"quotaBytes":%d,"reason":"write_error",'
        b'"schemaVersion":1}' % (len(output) - len(log), len(log), quota)
    )


def test_a_shim_under_a_file_size_limit_keeps_the_logs_head_and_records_the_exit_once(
    tmp_path: Path, launched: Launched
) -> None:
    """Writes past the limit fail EFBIG (no SIGXFSZ ends the shim): the log keeps what fit,
    the gap is recorded there, the job runs on to its own exit, published in one receipt.

    This guards the behaviour, a shim killed by SIGXFSZ, not the SIGXFSZ entry in
    ``_run_shim``'s ignore list: CPython ignores SIGXFSZ from start-up, so the test passes
    without that entry too (checked); the entry keeps it so should the start-up change."""
    limit, written = 100_000, 300_000
    spec = make_spec(
        tmp_path, ["/bin/sh", "-c", f"head -c {written} /dev/zero; echo done >&2; exit 0"]
    )
    status = launch(spec, launched, file_size_limit=limit)
    assert status["ok"] is True, status
    wait_shim_done(status)
    receipt = decode_receipt(receipt_path(spec).read_bytes())
    assert receipt.exit_code == 0 and receipt.signal is None
    assert sorted(p.name for p in Path(spec["receipt_dir"]).iterdir()) == [spec["receipt_name"]]
    assert Path(spec["log_path"]).read_bytes() == bytes(limit)
    assert Path(spec["log_path"] + ".truncated").read_bytes() == (
        b'{"droppedBytes":%d,"gapAt":%d,"quotaBytes":%d,"reason":"write_error",'
        b'"schemaVersion":1}' % (written + len(b"done\n") - limit, limit, 1 << 20)
    )


@pytest.mark.parametrize("where", ["inherited", "its_own"])
def test_a_job_past_its_file_size_limit_gets_sigxfsz_as_outside_the_panel(
    tmp_path: Path, launched: Launched, where: str
) -> None:
    """The shim ignores SIGXFSZ; the job gets the default back, so a write past its limit
    (the shim's, inherited, or one it sets itself) ends it with SIGXFSZ, as in a shell."""
    limit = 8192  # room for the receipt's reservation (4096 bytes)
    script = "exec head -c 20000 /dev/zero > out"
    if where == "its_own":
        script = f"ulimit -f {limit // 512}; {script}"
    spec = make_spec(tmp_path, ["/bin/sh", "-c", script])
    status = launch(spec, launched, file_size_limit=limit if where == "inherited" else None)
    assert status["ok"] is True, status
    wait_shim_done(status)
    receipt = decode_receipt(receipt_path(spec).read_bytes())
    assert receipt.signal == signal.SIGXFSZ and receipt.exit_code == 128 + signal.SIGXFSZ
    assert (tmp_path / "out").stat().st_size == limit


def test_a_job_users_job_past_its_file_size_limit_gets_sigxfsz_too(
    tmp_path: Path, launched: Launched
) -> None:
    """The same through ``fork`` + ``execve`` (a job user), which resets what the shim ignores."""
    job_user_or_skip()
    limit = 8192
    with reachable_dir() as root:
        homes = root / "homes"
        homes.mkdir(mode=0o700)
        os.chown(homes, JOB_UID, JOB_UID)
        job = {"uid": JOB_UID, "gid": JOB_UID, "umask": 0o077, "home": None,
               "home_root": str(homes)}  # fmt: skip
        script = 'exec head -c 20000 /dev/zero > "$HOME/out"'
        spec = make_spec(tmp_path, ["/bin/sh", "-c", script], cwd="/", job=job)
        status = launch(spec, launched, file_size_limit=limit)
        assert status["ok"] is True, status
        wait_shim_done(status)
        receipt = decode_receipt(receipt_path(spec).read_bytes())
        assert receipt.signal == signal.SIGXFSZ and receipt.exit_code == 128 + signal.SIGXFSZ
        poll_until(lambda: list(homes.iterdir()) == [])  # the HOME's remover is not waited for


def test_output_past_the_head_but_within_the_quota_is_kept_whole(
    tmp_path: Path, launched: Launched
) -> None:
    quota = 1 << 20
    spec, _status, _receipt = run_to_receipt(
        tmp_path, ["/bin/sh", "-c", f"seq 1 1000; head -c {quota - 10_000} /dev/zero; seq 1 9"],
        launched, log_quota_bytes=quota,
    )  # fmt: skip
    head = b"".join(b"%d\n" % i for i in range(1, 1001))
    tail = b"".join(b"%d\n" % i for i in range(1, 10))
    log = Path(spec["log_path"]).read_bytes()
    assert log == head + bytes(quota - 10_000) + tail
    assert not Path(spec["log_path"] + ".truncated").exists()


def test_a_job_that_closes_its_output_then_runs_on_is_waited_for(
    tmp_path: Path, launched: Launched
) -> None:
    """EOF before the exit: the shim waits on the job's pidfd alone (the pipe at EOF would
    wake it for ever), then records the real exit code and time."""
    _spec, _status, receipt = run_to_receipt(
        tmp_path, ["/bin/sh", "-c", "echo out; exec >&- 2>&-; sleep 0.5; exit 4"], launched
    )
    assert receipt.exit_code == 4 and receipt.signal is None
    assert receipt.finished_at_ms - receipt.started_at_ms >= 500
    assert (tmp_path / "job.log").read_bytes() == b"out\n"


def test_killed_by_signal_sets_signal_field(tmp_path: Path, launched: Launched) -> None:
    _spec, _status, receipt = run_to_receipt(
        tmp_path, ["/bin/sh", "-c", "echo bye; kill -KILL $$"], launched
    )
    assert receipt.signal == signal.SIGKILL and receipt.exit_code == 128 + signal.SIGKILL


def test_job_gets_default_sigpipe_and_term(tmp_path: Path, launched: Launched) -> None:
    # Python ignores SIGPIPE; the job must get default dispositions back.
    _spec, _status, receipt = run_to_receipt(
        tmp_path, ["/bin/sh", "-c", "kill -TERM $$; sleep 5"], launched
    )
    assert receipt.signal == signal.SIGTERM and receipt.exit_code == 143


def test_environment_is_exactly_the_spec_env(tmp_path: Path, launched: Launched) -> None:
    env = {"ALPHA": "1", "BETA": "two words", "EMPTY": ""}
    spec, _status, receipt = run_to_receipt(tmp_path, ["/usr/bin/env"], launched, env=env)
    assert receipt.exit_code == 0
    lines = Path(spec["log_path"]).read_text().splitlines()
    assert sorted(lines) == sorted(f"{k}={v}" for k, v in env.items())


def test_bare_command_is_resolved_with_the_job_path(tmp_path: Path, launched: Launched) -> None:
    spec, _status, receipt = run_to_receipt(
        tmp_path, ["echo", "found"], launched, env={"PATH": "/nonexistent:/bin:/usr/bin"}
    )
    assert receipt.exit_code == 0
    assert Path(spec["log_path"]).read_bytes() == b"found\n"


def test_job_has_only_stdio_fds(tmp_path: Path, launched: Launched) -> None:
    spec, _status, receipt = run_to_receipt(
        tmp_path, ["/bin/ls", "-l", "/proc/self/fd/"], launched
    )
    assert receipt.exit_code == 0
    targets = fd_targets(spec["log_path"])
    # fd 3 is the directory ls itself opened to list /proc/self/fd.
    assert set(targets) <= {0, 1, 2, 3}, targets
    assert targets.get(3, "/proc/").startswith("/proc/")
    assert targets[0] == "/dev/null"
    assert targets[1] == targets[2] and targets[1].startswith("pipe:")


def test_job_runs_in_its_own_process_group_and_not_the_shim_session_leader(
    tmp_path: Path, launched: Launched
) -> None:
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"])
    status = launch(spec, launched)
    job, shim = status["pid"], status["shim_pid"]
    assert os.getpgid(job) == job
    assert os.getsid(job) == os.getsid(shim) != os.getsid(0)
    assert os.getpgid(shim) != job
    # The long-lived shim is not a child of the launcher.
    assert ppid(shim) != os.getpid()
    (tmp_path / "go").touch()
    wait_shim_done(status)
    assert decode_receipt(receipt_path(spec).read_bytes()).exit_code == 0


# ---- survival -------------------------------------------------------------------------

_INTERMEDIATE = r"""
import json, subprocess, sys, time
spec = sys.stdin.buffer.read()
p = subprocess.Popen([sys.executable, "-I", "-S", sys.argv[1]], stdin=subprocess.PIPE,
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
    start_new_session=True, env={})
p.stdin.write(spec); p.stdin.close()
line = p.stdout.readline()
p.wait()
sys.stdout.buffer.write(line); sys.stdout.flush()
time.sleep(600)
"""


def test_worker_death_does_not_kill_the_shim(tmp_path: Path, launched: Launched) -> None:
    spec = make_spec(
        tmp_path,
        [
            "/bin/sh",
            "-c",
            "echo started; while [ ! -e go ]; do sleep 0.02; done; echo done; exit 5",
        ],
    )
    worker = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _INTERMEDIATE, SHIM],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert worker.stdin is not None and worker.stdout is not None
    try:
        worker.stdin.write(json.dumps(spec).encode())
        worker.stdin.close()
        fd = worker.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], DEADLINE)
        assert ready
        status = json.loads(os.read(fd, 4096))
        launched.track_status(status)
        assert status["ok"] is True
    finally:
        worker.kill()
        worker.wait(timeout=DEADLINE)
        worker.stdout.close()
    assert read_identity(status["shim_pid"]) is not None
    assert read_identity(status["pid"]) is not None
    (tmp_path / "go").touch()
    wait_shim_done(status)
    receipt = decode_receipt(receipt_path(spec).read_bytes())
    assert receipt.exit_code == 5
    assert Path(spec["log_path"]).read_bytes() == b"started\ndone\n"


def test_shim_ignores_term_hup_int(tmp_path: Path, launched: Launched) -> None:
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"])
    status = launch(spec, launched)
    shim = status["shim_pid"]
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        os.kill(shim, sig)
    # A stopping signal is delivered synchronously to a sleeping process; prove it survived
    # by letting the job finish and getting the receipt.
    (tmp_path / "go").touch()
    wait_shim_done(status)
    assert decode_receipt(receipt_path(spec).read_bytes()).exit_code == 0


def test_shim_sigkill_leaves_no_receipt_and_writer_gets_sigpipe(
    tmp_path: Path, launched: Launched
) -> None:
    spec = make_spec(tmp_path, ["/usr/bin/yes"], log_quota_bytes=1024)
    status = launch(spec, launched)
    job, shim = status["pid"], status["shim_pid"]
    job_fd = os.pidfd_open(job)
    try:
        # The head (the quota less its quarter kept for the tail) is full: it is draining.
        poll_until(lambda: os.stat(spec["log_path"]).st_size == 768)
        os.kill(shim, signal.SIGKILL)
        assert wait_exit(shim, DEADLINE)
        # The read end is gone: the writing job dies of SIGPIPE instead of hanging.
        assert select.select([job_fd], [], [], DEADLINE)[0], "job hung after the shim died"
    finally:
        os.close(job_fd)
    assert not receipt_path(spec).exists()
    assert os.stat(spec["log_path"]).st_size == 768  # the tail in its memory died with it


def test_descendant_holding_the_pipe_does_not_block_the_receipt(
    tmp_path: Path, launched: Launched
) -> None:
    spec = make_spec(tmp_path, ["/bin/sh", "-c", "sleep 60 & echo $!; exit 4"])
    status = launch(spec, launched)
    try:
        wait_shim_done(status)
        receipt = decode_receipt(receipt_path(spec).read_bytes())
        assert receipt.exit_code == 4
        # Bounded post-exit drain: published about one second after the job's exit.
        assert receipt.finished_at_ms - receipt.started_at_ms < 10_000
    finally:
        text = Path(spec["log_path"]).read_text().strip()
        if text.isdigit():
            launched.track_pid(int(text))


# ---- failures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "errno_"),
    [(["/nonexistent/definitely-not-here"], 2), (["no-such-command-ql"], 2)],
)
def test_exec_failure(tmp_path: Path, launched: Launched, argv: list[str], errno_: int) -> None:
    spec = make_spec(tmp_path, argv)
    status = launch(spec, launched)
    assert status == {"ok": False, "error": "EXEC_FAILED", "errno": errno_}
    assert list(Path(spec["receipt_dir"]).iterdir()) == []


def test_exec_permission_denied(tmp_path: Path, launched: Launched) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o600)
    spec = make_spec(tmp_path, [str(script)])
    status = launch(spec, launched)
    assert status == {"ok": False, "error": "EXEC_FAILED", "errno": 13}
    assert list(Path(spec["receipt_dir"]).iterdir()) == []


def test_cwd_invalid(tmp_path: Path, launched: Launched) -> None:
    spec = make_spec(tmp_path, ["/bin/true"], cwd=str(tmp_path / "missing"))
    assert launch(spec, launched) == {"ok": False, "error": "CWD_INVALID", "errno": 2}


def test_log_symlink_is_refused(tmp_path: Path, launched: Launched) -> None:
    spec = make_spec(tmp_path, ["/bin/true"])
    link = tmp_path / "link.log"
    link.symlink_to(spec["log_path"])
    spec["log_path"] = str(link)
    assert launch(spec, launched) == {"ok": False, "error": "LOG_OPEN_FAILED", "errno": 40}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: b"not json",
        lambda s: b"\xff",
        lambda s: json.dumps([s]).encode(),
        lambda s: json.dumps({**s, "protocol": 2}).encode(),
        lambda s: json.dumps({**s, "extra": 1}).encode(),
        lambda s: json.dumps({**s, "argv": []}).encode(),
        lambda s: json.dumps({**s, "argv": ["/bin/true\x00x"]}).encode(),
        lambda s: json.dumps({**s, "env": {"A=B": "x"}}).encode(),
        lambda s: json.dumps({**s, "callback_sequence": True}).encode(),
        lambda s: json.dumps({**s, "receipt_name": "../x.json"}).encode(),
        lambda s: json.dumps({**s, "cwd": "relative"}).encode(),
        lambda s: json.dumps({**s, "test_hook": "nope"}).encode(),
        lambda s: json.dumps({**s, "max_processes": 0}).encode(),
        lambda s: json.dumps({**s, "max_processes": True}).encode(),
        lambda s: json.dumps({**s, "max_processes": "10"}).encode(),
        lambda s: json.dumps({**s, "max_processes": 4_194_305}).encode(),
    ],
)
def test_spec_invalid(tmp_path: Path, launched: Launched, mutate: Any) -> None:
    spec = make_spec(tmp_path, ["/bin/true"])
    status = launch(mutate(spec), launched)
    assert status == {"ok": False, "error": "SPEC_INVALID", "errno": None}
    assert os.stat(spec["log_path"]).st_size == 0


# ---- publication ----------------------------------------------------------------------


def test_existing_receipt_is_never_overwritten(tmp_path: Path, launched: Launched) -> None:
    spec = make_spec(tmp_path, ["/bin/true"])
    receipt_path(spec).write_bytes(b"earlier")
    status = launch(spec, launched)
    wait_shim_done(status)
    assert receipt_path(spec).read_bytes() == b"earlier"
    assert sorted(p.name for p in Path(spec["receipt_dir"]).iterdir()) == [spec["receipt_name"]]


def test_crash_before_receipt_publishes_nothing(tmp_path: Path, launched: Launched) -> None:
    spec = make_spec(tmp_path, ["/bin/echo", "x"], test_hook="exit_before_receipt")
    status = launch(spec, launched)
    wait_shim_done(status)
    # Only the receipt's reservation, never a final name (the journal's cleanup removes it).
    names = [p.name for p in Path(spec["receipt_dir"]).iterdir()]
    assert names == [f".{spec['receipt_name']}.tmp"]
    assert Path(spec["log_path"]).read_bytes() == b"x\n"


def test_crash_after_temp_write_leaves_only_temp(tmp_path: Path, launched: Launched) -> None:
    spec = make_spec(tmp_path, ["/bin/true"], test_hook="exit_after_temp_write")
    status = launch(spec, launched)
    wait_shim_done(status)
    names = [p.name for p in Path(spec["receipt_dir"]).iterdir()]
    assert names == [f".{spec['receipt_name']}.tmp"]
    # The temp holds a complete, valid payload; it is just never the final name.
    temp = Path(spec["receipt_dir"]) / names[0]
    assert decode_receipt(temp.read_bytes()).exit_code == 0


def test_shim_is_the_subreaper_of_orphaned_descendants(tmp_path: Path, launched: Launched) -> None:
    # The subshell exits at once, orphaning its `sleep`: it must be re-parented to the shim.
    script = "(sleep 30 </dev/null >/dev/null 2>&1 & echo $!); sleep 30"
    spec = make_spec(tmp_path, ["/bin/sh", "-c", script])
    status = launch(spec, launched)
    log = Path(spec["log_path"])
    poll_until(lambda: log.read_text().strip().isdigit())
    orphan = int(log.read_text().strip())
    launched.track_pid(orphan)

    poll_until(lambda: ppid(orphan) == status["shim_pid"])
