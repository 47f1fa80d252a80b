"""The service's files are private: created 0600/0700, and a loose one stops every role.

Real processes started from a loose umask (022), real files and modes. A role that finds its
data dir, database or key file open to group or others exits at once with status 2 and one
line naming the ``chmod`` that fixes it (app/storage/private_files.py).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from app.storage.private_files import NotPrivate, require_own_socket_dir
from tests.e2e.conftest import free_port
from tests.jobuser import JOB_UID, job_user_or_skip

LOOSE_UMASK = 0o022


def ql(
    *args: str, data_dir: Path, timeout: float = 60, **env_extra: str
) -> subprocess.CompletedProcess[str]:
    """``python -m app ARGS`` from a loose umask, with a private data dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_DATA_DIR"] = str(data_dir)
    env |= env_extra
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        umask=LOOSE_UMASK,
    )


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir made by ``qinglong migrate`` from a loose umask, with its key file: made
    once (two interpreter starts), copied with its modes for each test."""
    root = tmp_path_factory.mktemp("file-modes") / "data"
    done = ql("migrate", data_dir=root)
    assert done.returncode == 0, done.stderr
    done = ql("secrets", "rotate-key", data_dir=root)  # creates the key file on first use
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture
def data_dir(made: Path, tmp_path: Path) -> Path:
    """A private copy of ``made``: copytree keeps every file's and the dir's mode."""
    return Path(shutil.copytree(made, tmp_path / "data"))


def test_migrate_from_a_loose_umask_creates_only_private_files(made: Path) -> None:
    assert mode_of(made) == 0o700
    assert mode_of(made / "qinglong.db") == 0o600
    assert mode_of(made / "secret.key") == 0o600


def _role_argv(role: str) -> list[str]:
    if role in ("serve", "api"):
        return [role, "--host", "127.0.0.1", "--port", str(free_port())]
    return [role]


@pytest.mark.parametrize(
    ("role", "loose", "mode", "fix"),
    [
        # Every role with a loose data dir; each kind of file with one role (one check serves
        # them all: app.cli.common.private_settings).
        *[(role, "", 0o755, "chmod 700") for role in ("migrate", "serve", "api", "worker")],
        ("serve", "qinglong.db", 0o644, "chmod 600"),
        ("worker", "secret.key", 0o640, "chmod 600"),
        ("api", "qinglong.db-wal", 0o604, "chmod 600"),
        ("migrate", "qinglong.db-shm", 0o660, "chmod 600"),
    ],
)
def test_a_loose_file_stops_every_role_with_the_fix(
    data_dir: Path, role: str, loose: str, mode: int, fix: str
) -> None:
    path = data_dir / loose if loose else data_dir
    if not path.exists():
        path.write_bytes(b"")  # an empty -wal is what SQLite leaves when it is open elsewhere
    os.chmod(path, mode)
    done = ql(*_role_argv(role), data_dir=data_dir, timeout=30)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"{fix} {path}" in lines[0], lines[0]
    assert f"mode {mode:04o}" in lines[0]
    assert "Traceback" not in done.stderr
    assert mode_of(path) == mode  # refused, never silently repaired


def test_every_loose_path_is_named_in_one_line(data_dir: Path) -> None:
    os.chmod(data_dir, 0o750)
    os.chmod(data_dir / "qinglong.db", 0o660)
    done = ql("migrate", data_dir=data_dir)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.endswith(f"chmod 700 {data_dir}; chmod 600 {data_dir / 'qinglong.db'}"), line


def test_the_fix_the_message_names_lets_the_role_start(data_dir: Path) -> None:
    os.chmod(data_dir / "qinglong.db", 0o644)
    assert ql("migrate", data_dir=data_dir).returncode == 2
    os.chmod(data_dir / "qinglong.db", 0o600)
    done = ql("migrate", data_dir=data_dir)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("role", ["worker", "serve"])
@pytest.mark.parametrize("loose", ["0777", "1777", "0770", "job user's"])
def test_a_worker_socket_directory_another_user_may_write_stops_the_worker(
    data_dir: Path, short_dir: Path, role: str, loose: str
) -> None:
    # A job could remove the socket there and bind its own, or (sticky, /tmp) bind the path
    # first while the worker is down, which a worker not running as root cannot undo
    # (docs/job-user.md § The worker socket). Before, the worker started in such a directory.
    socks = short_dir / "socks"
    socks.mkdir()
    if loose == "job user's":
        job_user_or_skip()  # chown needs root
        os.chown(socks, JOB_UID, JOB_UID)
        os.chmod(socks, 0o700)
        said = f"{socks}, the worker socket's directory, is owned by uid {JOB_UID}"
    elif loose == "0770":  # writable by a group that is not the service's
        job_user_or_skip()  # chown needs root
        os.chown(socks, -1, JOB_UID)
        os.chmod(socks, 0o770)
        said = f"{socks} (mode 0770), the worker socket's directory, is writable by group {JOB_UID}"
    else:
        os.chmod(socks, int(loose, 8))
        said = f"{socks} (mode {loose}), the worker socket's directory, is writable by others"
    done = ql(*_role_argv(role), data_dir=data_dir, timeout=30,
              QL_WORKER_SOCKET=str(socks / "w.sock"))  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"qinglong: {said}"), line
    assert "fix with: " in line and "QL_WORKER_SOCKET unset" in line
    assert list(socks.iterdir()) == []  # refused before anything was bound


def test_a_socket_directory_only_the_service_may_write_is_taken(short_dir: Path) -> None:
    # The service's own, or writable by its own group too (a RuntimeDirectory= of root and
    # the service's group): no refusal. Writable by others, sticky or not: refused.
    os.chown(short_dir, -1, os.getegid())
    for mode in (0o700, 0o755, 0o770):
        os.chmod(short_dir, mode)
        require_own_socket_dir(short_dir / "w.sock")
    require_own_socket_dir(short_dir / "missing" / "w.sock")  # bind fails later, by itself
    for mode in (0o757, 0o1777):
        os.chmod(short_dir, mode)
        with pytest.raises(NotPrivate):
            require_own_socket_dir(short_dir / "w.sock")
    os.chmod(short_dir, 0o700)
