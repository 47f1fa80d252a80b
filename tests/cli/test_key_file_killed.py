"""First ``qinglong api`` starts SIGKILLed while they publish the key file (real processes).

The key file is written whole under a temp name, then linked into place (never replacing),
then the temp name is removed (app/storage/secret_crypto.py). A start is halted at either
side of the ``link()`` (tests/cli/crash_key_file.py) and killed with SIGKILL there: one
before, the next after. Then a start that serves (a real api, which stores a secret) keeps
exactly one working key, the temps are kept while they may be a publish still under way and
swept once older than ``TEMP_SWEEP_AGE_S``, and the secret stored under the key survives the
sweep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.cli.common import make_first_start_files
from app.domain.tokens import new_api_token
from app.settings import Settings
from app.storage.durable import TEMP_SWEEP_AGE_S
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.secret_crypto import KeyRing
from app.storage.secrets_repo import SecretRepository, stored_key_ids
from app.storage.tokens_repo import TokenRepository
from tests.e2e.conftest import REPO_ROOT, free_port
from tests.kit import web

START_S = 30.0


class _Starts:
    """The ``qinglong api`` processes of one test; any still running at its end is killed."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd  # not the checkout: a relative path would write there
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, port: int, module: str = "app", **extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", module, "api", "--host", "127.0.0.1", "--port",
                str(port), "--workers", "1"]  # fmt: skip
        proc = subprocess.Popen(
            argv, env=self.env | extra, cwd=self.cwd, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                _kill9(proc)
            if proc.stderr is not None:
                proc.stderr.close()


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            pytest.fail(f"{what}: exited {proc.returncode} first: {err}")
        time.sleep(0.02)
    pytest.fail(f"{what}: not within {START_S} s")


def _healthy(port: int) -> bool:
    try:
        return web.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL


def _orphans(data: Path) -> dict[str, bytes]:
    """The key file's temp files left in ``data``: name -> bytes (a whole key line each)."""
    found = {p.name: p.read_bytes() for p in data.glob(".secret.key.*.tmp")}
    assert all(len(b.splitlines()) == 1 and len(b.split()) == 2 for b in found.values())
    return found


def test_api_starts_killed_while_publishing_their_key_leave_one_working_key(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    key_file = data / "secret.key"
    url = f"sqlite:///{tmp_path / 'q.db'}"
    engine = make_engine(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QL_", "QLTEST_"))}
    env |= {"QL_DATA_DIR": str(data), "QL_DATABASE_URL": url,
            "QL_WORKER_SOCKET": str(tmp_path / "w.sock"), "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    starts = _Starts(env, tmp_path)
    try:
        upgrade_to_head(engine)
        token = new_api_token()
        TokenRepository(engine).create(name="t", scopes=frozenset({"admin"}), token=token)

        # 1. A first start halted before its link() and killed there for real: its temp
        # holds a whole key, fsynced, that never became the key.
        halted = tmp_path / "halted-1"
        first = starts.start(free_port(), "tests.cli.crash_key_file",
                             QLTEST_CRASH_AT="before_link", QLTEST_CRASH_MARK=str(halted))  # fmt: skip
        _wait(halted.exists, first, "the first start halted before its link()")
        _kill9(first)
        [(name_1, orphan_1)] = _orphans(data).items()
        assert not key_file.exists()

        # 2. The next start, halted after its link() and killed: its key is the key (a second
        # name of it left); the first start's temp is young (a publish may be under way): kept.
        halted = tmp_path / "halted-2"
        second = starts.start(free_port(), "tests.cli.crash_key_file",
                              QLTEST_CRASH_AT="after_link", QLTEST_CRASH_MARK=str(halted))  # fmt: skip
        _wait(halted.exists, second, "the second start halted after its link()")
        _kill9(second)
        orphans = _orphans(data)
        assert orphans.pop(name_1) == orphan_1
        [(name_2, orphan_2)] = orphans.items()
        assert os.path.samestat((data / name_2).stat(), key_file.stat())
        published = key_file.read_bytes()
        assert published == orphan_2 and orphan_2.split()[0] != orphan_1.split()[0]

        # 3. A start that serves: exactly one working key, the second's; a secret stored
        # through it. Both temps are still young: kept.
        port = free_port()
        third = starts.start(port)
        _wait(lambda: _healthy(port), third, "the third start served")
        put = web.put(
            f"http://127.0.0.1:{port}/api/v1/secrets/db-pw",
            json={"value": "kept-through-the-sweep"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert put.status_code == 204, put.text
        _kill9(third)
        assert key_file.read_bytes() == published
        assert _orphans(data) == {name_1: orphan_1, name_2: orphan_2}

        # 4. Once the temps are older than the sweep age, a start removes them, nothing else:
        # what ``qinglong api`` runs before uvicorn (here in this process: a start less).
        old = time.time() - TEMP_SWEEP_AGE_S - 5
        for name in (name_1, name_2):
            os.utime(data / name, (old, old))
        assert make_first_start_files(Settings.from_env(env)) is None
        assert sorted(p.name for p in data.iterdir() if "secret" in p.name) == ["secret.key"]
        assert key_file.read_bytes() == published
        assert key_file.stat().st_mode & 0o777 == 0o600
        ring = KeyRing.from_settings(secret_key=None, key_file=key_file)
        assert ring.ids() == [orphan_2.split()[0].decode()]
        assert stored_key_ids(engine) == ring.ids()
        assert SecretRepository(engine, ring).resolve(frozenset({"db-pw"})) == {
            "db-pw": "kept-through-the-sweep"
        }
    finally:
        starts.close()
        engine.dispose()
