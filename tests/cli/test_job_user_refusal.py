"""A configured job user the worker cannot switch to stops ``serve`` and ``worker`` at once.

Real processes: ``qinglong worker`` and ``qinglong serve`` run as ``nobody`` (setpriv, no
capabilities) with ``QL_JOB_USER`` naming another user, on a data dir nobody owns. Each exits
with status 2 and one line before it opens the database or takes the lease; a run is never
started as the service's own user instead (docs/job-user.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import free_port
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir

REPO = Path(__file__).resolve().parents[2]
OTHER_USER = "daemon"  # uid 1 on Debian-like hosts: anyone but nobody and root


def _as_nobody(args: list[str], data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    python = Path("/usr/bin", minor)
    if not python.exists():
        pytest.skip(f"no {python} the unprivileged user may run")
    site = Path(sys.prefix, "lib", minor, "site-packages")
    clean = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{REPO}", "QL_DATA_DIR": str(data_dir)}
    argv = ["setpriv", f"--reuid={JOB_UID}", f"--regid={JOB_UID}", "--clear-groups",
            "env", "-i", *(f"{k}={v}" for k, v in {**clean, **env}.items()),
            str(python), "-m", "app", *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")


@pytest.mark.parametrize("role", ["worker", "serve"])
def test_a_worker_that_cannot_switch_users_refuses_to_start_with_one_line(role: str) -> None:
    job_user_or_skip()
    try:
        import pwd

        pwd.getpwnam(OTHER_USER)
    except KeyError:
        pytest.skip(f"no user {OTHER_USER} here")
    with reachable_dir() as root:
        data_dir = root / "data"
        data_dir.mkdir(mode=0o700)
        os.chown(data_dir, JOB_UID, JOB_UID)
        args = [role] if role == "worker" else [role, "--port", str(free_port())]
        done = _as_nobody(args, data_dir, QL_JOB_USER=OTHER_USER)
        left = sorted(p.name for p in data_dir.iterdir())
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("qinglong: QL_JOB_USER/QL_JOB_USERS is set but this process")
    assert "CAP_SETUID, CAP_SETGID, CAP_KILL" in lines[0]
    assert left == [], "nothing is opened or created before the refusal"


def test_an_unknown_or_own_job_user_is_refused_before_anything_is_opened(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    data_dir = tmp_path / "data"
    me = str(os.geteuid())
    for user, words in (("ql-no-such-user", "does not exist"), (me, "the service's own user")):
        done = subprocess.run(
            [sys.executable, "-m", "app", "worker"], capture_output=True, text=True, timeout=60,
            env={**env, "QL_DATA_DIR": str(data_dir), "QL_JOB_USER": user},
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr
        assert not (data_dir / "qinglong.db").exists()


@pytest.mark.parametrize("role", ["worker", "serve"])
def test_a_job_user_whose_primary_group_is_the_services_is_refused(
    role: str, tmp_path: Path
) -> None:
    # The service runs with nobody's group (nogroup) as its own: a job as nobody would hold
    # the group of the service's group-readable files, such as the environment file the
    # systemd units read (root:qinglong 0640, with the database password and the key).
    job_user_or_skip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    data_dir = tmp_path / "data"
    args = [role] if role == "worker" else [role, "--port", str(free_port())]
    argv = ["setpriv", f"--regid={JOB_UID}", "--clear-groups",
            sys.executable, "-m", "app", *args]  # fmt: skip
    proc = subprocess.Popen(
        argv, env={**env, "QL_DATA_DIR": str(data_dir), "QL_JOB_USER": "nobody"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.terminate()  # it started: stop it (serve stops its services first), by its pid
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        pytest.fail(f"{role} started with a job user of its own group")
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, err
    assert len(lines) == 1, err
    assert f"primary group (gid {JOB_UID}) is the service's" in lines[0], err
    assert not (data_dir / "qinglong.db").exists()
