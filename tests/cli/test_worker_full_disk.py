"""``qinglong worker`` on a full disk or a read-only data dir: one line naming what it could
not make and why, exit 1, nothing half made; once there is room the next start serves (a
read-only mount made writable again is that same start: a refused start could write nothing
there). docs/disk-full-and-readiness.md § The worker's start.

Real file systems: a tmpfs whose inodes are all used (a directory or a socket file needs one;
tmpfs gives them no block, so a disk of full blocks alone would let them be made), and a
tmpfs remounted read-only (a mode would not stop root). The database lives outside, with
room, as a PostgreSQL database or a SQLite file on another volume would: the worker gets past
its schema check and its lease to the files of its own.

Before, each of these starts ended in a Python traceback (``os.mkdir`` of ``receipts/`` or
``receipts/.quarantine``, the data dir's ``mkdir``), in a line only a developer reads
(``cannot bind the worker socket ...: ENOSPC``), or with a wrong cure (a read-only data dir
was "not writable by this service's user ...; fix with: chown"). A shard that could not be
made was logged as "not directories" and the worker served, every launch hashing to it then
failing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.secret_crypto import KeyRing
from app.worker.instance import instance_id
from app.worker.receipts import ReceiptStore
from tests.disk import fill, mounted_tmpfs, use_every_inode
from tests.e2e.conftest import free_port, wait_until

FULL = "(No space left on device): free space in the data dir and start again"


@pytest.fixture
def database(tmp_path: Path) -> str:
    """A migrated SQLite database outside the full disk."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    engine = make_engine(url)
    upgrade_to_head(engine)
    engine.dispose()
    return url


def _env(data: Path, url: str, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    return env | {"QL_DATA_DIR": str(data), "QL_DATABASE_URL": url} | more


def _refused(env: dict[str, str]) -> str:
    """The worker's start, refused: its one line (no traceback), exit 1."""
    done = subprocess.run(
        [sys.executable, "-m", "app", "worker"], capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert lines and lines[-1].startswith("qinglong: "), done.stderr
    # Only log lines (time, role, level) before it: the lease taken and given back.
    assert all(" worker " in line for line in lines[:-1]), done.stderr
    return lines[-1]


@contextlib.contextmanager
def _running(
    command: list[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """``qinglong COMMAND`` started with its output in ``log``; killed (by its pid) if the
    test leaves it running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", *command], env=env, stdin=subprocess.DEVNULL,
            stdout=out, stderr=out,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _serves(env: dict[str, str], socket_path: Path, log: Path) -> None:
    """The worker starts and listens; then stopped with SIGTERM (exit 0)."""
    with _running(["worker"], env, log) as proc:
        deadline = time.monotonic() + 30
        while b"worker listening" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert socket_path.is_socket()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


@pytest.fixture
def full_fs(short_dir: Path) -> Iterator[Path]:
    """A 60 MiB tmpfs with few inodes, at a short path (the socket's ~100 byte limit)."""
    with mounted_tmpfs(short_dir / "fs", size_mib=60, inodes=400) as fs:
        yield fs


def _fill(fs: Path) -> list[Path]:
    """Every inode and every block used; what to remove to free them."""
    return [fill(fs), use_every_inode(fs)]


def _free(fillers: list[Path]) -> None:
    for path in fillers:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def test_a_worker_on_a_full_disk_names_each_file_it_cannot_make_and_starts_once_freed(
    full_fs: Path, database: str, tmp_path: Path,
) -> None:  # fmt: skip
    data = full_fs / "data"
    env = _env(data, database)
    sock = data / "worker.sock"
    # No data dir at all (its parent full).
    fillers = _fill(full_fs)
    assert _refused(env) == (
        f"qinglong: cannot make {data} (No space left on device): free space in {full_fs} "
        "and start again"
    )
    assert not data.exists()
    _free(fillers)
    # Each stage a first start can be cut at: the data dir with its id (a backup restored),
    # then receipts/ without its quarantine, then without its shards, then no socket.
    data.mkdir(mode=0o700)
    instance_id(data)
    store = ReceiptStore(data / "receipts")
    stages = [
        (lambda: None, f"qinglong: cannot make {data}/receipts {FULL}"),
        (lambda: (data / "receipts").mkdir(mode=0o700),
         f"qinglong: cannot make {data}/receipts/.quarantine {FULL}"),
        (store.ensure_root, f"qinglong: cannot make {data}/receipts/00 {FULL}"),
        (store.ensure_shards, f"qinglong: cannot make {sock} {FULL}"),
    ]  # fmt: skip
    for made, line in stages:
        made()
        before = sorted(p.relative_to(data) for p in data.rglob("*"))
        fillers = _fill(full_fs)
        assert _refused(env) == line
        # Nothing half made: no socket file, and only what the stage had (or whole dirs).
        assert not sock.exists() and not sock.is_symlink()
        after = sorted(p.relative_to(data) for p in data.rglob("*"))
        assert set(before) <= set(after), line
        assert all((data / p).is_dir() for p in set(after) - set(before)), line
        _free(fillers)
    # Room again: the same data dir starts.
    _serves(env, sock, tmp_path / "worker.log")


def test_a_worker_on_a_read_only_data_dir_says_so_not_to_chown_it(
    full_fs: Path, database: str, tmp_path: Path,
) -> None:  # fmt: skip
    data = full_fs / "data"
    env = _env(data, database)
    sock = data / "worker.sock"

    def remount(mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(full_fs)], check=True)

    remount("ro")
    assert _refused(env) == f"qinglong: cannot make {data} (Read-only file system)"
    remount("rw")
    # What a start makes before its socket (as a start that served and stopped leaves it).
    data.mkdir(mode=0o700)
    instance_id(data)
    store = ReceiptStore(data / "receipts")
    store.ensure_root()
    store.ensure_shards()
    remount("ro")
    # Root may write any mode, but not a read-only mount: not a chown to fix.
    assert _refused(env) == f"qinglong: cannot make {sock} (Read-only file system)"
    # The socket elsewhere: the receipts a launch must leave cannot be.
    elsewhere = _env(data, database, QL_WORKER_SOCKET=str(tmp_path / "w.sock"))
    assert _refused(elsewhere) == (
        f"qinglong: cannot make receipts in {data}/receipts (Read-only file system)"
    )


def test_a_worker_whose_database_cannot_get_an_inode_says_the_disk_is_full_not_the_url(
    full_fs: Path, tmp_path: Path,
) -> None:  # fmt: skip
    # The default: the SQLite database in the data dir. Closed cleanly it keeps no -wal or
    # -shm, and with no inode left SQLite cannot make them: SQLITE_CANTOPEN, which before
    # was told "check QL_DATABASE_URL and run `qinglong migrate`", the one command failing.
    data = full_fs / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_DATA_DIR"] = str(data)
    migrated = subprocess.run(
        [sys.executable, "-m", "app", "migrate"], capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    instance_id(data)
    fillers = _fill(full_fs)
    assert _refused(env) == (
        "qinglong: the database cannot store writes now (disk full or read-only); retry later"
    )
    _free(fillers)
    _serves(env, data / "worker.sock", tmp_path / "worker.log")


def test_serve_logs_the_refused_worker_s_line_and_restarts_it_until_there_is_room(
    short_dir: Path, tmp_path: Path,
) -> None:  # fmt: skip
    # docs/disk-full-and-readiness.md § The worker's start: under serve the line is the
    # worker's log line, each try; the supervisor backs off and the worker serves once freed.
    # Inodes for the api's 257 log directories too, which it makes once space is freed.
    with mounted_tmpfs(short_dir / "fs", size_mib=60, inodes=1000) as fs:
        _serve_on_a_full_disk(fs, tmp_path)


def _serve_on_a_full_disk(full_fs: Path, tmp_path: Path) -> None:
    data = full_fs / "data"
    data.mkdir(mode=0o700)
    KeyRing.from_settings(secret_key=None, key_file=data / "secret.key")
    instance_id(data)
    (data / "metrics").mkdir(mode=0o700)  # a data dir restored without receipts/
    for lock in ("serve.lock", "api.lock"):
        (data / lock).touch(mode=0o600)
    url = f"sqlite:///{tmp_path / 'q.db'}"  # serve migrates it: it has room
    fillers = _fill(full_fs)
    log = tmp_path / "serve.log"
    serve_argv = ["serve", "--host", "127.0.0.1", "--port", str(free_port())]
    with _running(serve_argv, _env(data, url), log) as serve:
        refusal = f" worker ERROR cannot make {data}/receipts {FULL}"
        wait_until("two refused starts", lambda: log.read_text().count(refusal) >= 2, 60)
        assert "supervisor WARNING worker exited (status 1) after" in log.read_text()
        _free(fillers)
        wait_until("the worker listening", lambda: "worker listening" in log.read_text(), 60)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert (data / "receipts" / "ff").is_dir()
