"""A non-root service with ambient CAP_SETUID/CAP_SETGID/CAP_KILL (the deploy/ units and the
container) runs its job as another user, and the job keeps none of those capabilities.

Real processes: the one-shot shim runs as ``nobody`` under ``setpriv`` with exactly those
ambient capabilities, the bounding set cut to them and ``no_new_privs`` (as systemd's
``AmbientCapabilities=`` with ``NoNewPrivileges=yes`` does), and starts a job as ``daemon``.
Without the shim clearing its ambient and inheritable sets, the job would inherit
CAP_SETUID through ``execve`` and could switch back to the service's user. The process limit
(docs/job-user.md "Process limit") is lowered there too, by a shim without CAP_SYS_RESOURCE.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.worker.launcher import shim_argv
from tests.integration.kit import DEADLINE, SHIM, make_spec, poll_until, read_status, receipt_path
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir

CAPS = "-all,+setuid,+setgid,+kill"
SCRIPT = (
    "id -u; grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status; "
    f"setpriv --reuid={JOB_UID} true 2>/dev/null && echo SWITCHED-BACK; "
    'kill -0 "$PPID" 2>/dev/null && echo SIGNALLED-SHIM; '
    "grep '^Max processes' /proc/self/limits; exit 5"
)


def test_a_job_started_by_a_capable_unprivileged_shim_keeps_no_capability() -> None:
    job_user_or_skip()
    try:
        target = pwd.getpwnam("daemon")
    except KeyError:
        pytest.skip("no user daemon here")
    python = Path(f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}")
    if not python.exists():
        pytest.skip(f"no {python} the unprivileged shim may run")
    with reachable_dir() as root:
        work = root / "shim"
        work.mkdir(mode=0o700)
        spec = make_spec(
            work, ["/bin/sh", "-c", SCRIPT], cwd="/",
            job={"uid": target.pw_uid, "gid": target.pw_gid, "umask": 0o077, "home": None,
                 "home_root": "/tmp"}, max_processes=10,
        )  # fmt: skip
        for path in [work, *work.rglob("*")]:
            os.chown(path, JOB_UID, JOB_UID)
        argv = ["setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_UID}", "--clear-groups",
                f"--inh-caps={CAPS}", f"--ambient-caps={CAPS}", f"--bounding-set={CAPS}",
                "--no-new-privs", *shim_argv(str(python), SHIM)]  # fmt: skip
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, env={},
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        status = json.loads(read_status(proc.stdout.fileno(), time.monotonic() + DEADLINE))
        proc.stdout.close()
        proc.wait(timeout=DEADLINE)
        assert status["ok"] is True, status
        poll_until(lambda: receipt_path(spec).exists())
        receipt = json.loads(receipt_path(spec).read_text())
        out = Path(spec["log_path"]).read_text()
    assert receipt["exitCode"] == 5
    lines = out.splitlines()
    assert lines[0] == str(target.pw_uid), out
    caps = dict(line.split(":\t") for line in lines[1:5])
    assert caps == {k: "0000000000000000" for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")}
    assert "SWITCHED-BACK" not in out and "SIGNALLED-SHIM" not in out, out
    assert lines[-1].split()[2:] == ["10", "10", "processes"], out  # RLIMIT_NPROC, soft and hard
