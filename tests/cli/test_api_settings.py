"""``qinglong api --data-dir``: uvicorn's spawned workers serve that data dir, not the default.

uvicorn builds the app in each worker by calling the factory without arguments, so the
flag reaches them only through ``Settings.to_env`` (app/cli/serve.py ``cmd_api``). Real
processes: a migrated database, the api with two workers, HTTP from outside.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from app.domain.profiles import EDGE
from app.domain.tokens import new_api_token
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.tokens_repo import TokenRepository
from tests.e2e.conftest import free_port
from tests.kit import web

START_S = 60.0


def test_settings_to_env_round_trips_what_a_flag_set(tmp_path: Path) -> None:
    flagged = Settings.from_env({}, data_dir=str(tmp_path / "flag"))
    child = Settings.from_env({"QL_DATA_DIR": "/elsewhere"} | flagged.to_env())
    assert (child.data_dir, child.database_url) == (flagged.data_dir, flagged.database_url)
    socketed = Settings.from_env({"QL_WORKER_SOCKET": str(tmp_path / "w.sock")})
    assert Settings.from_env(socketed.to_env()).socket_path == tmp_path / "w.sock"


@contextmanager
def _api(tmp_path: Path, short_dir: Path, data_dir: Path, workers: str) -> Iterator[int]:
    """A real ``qinglong api --data-dir`` (no QL_DATA_DIR) serving on a free port, answering
    /healthz; its output in ``tmp_path/api.log``; stopped by its pid at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_WORKER_SOCKET"] = str(short_dir / "w.sock")
    port = free_port()
    argv = [sys.executable, "-m", "app", "api", "--data-dir", str(data_dir)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--workers", workers]
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if web.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert proc.poll() is None, log.read_text()
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _migrated(data_dir: Path) -> Settings:
    """Edge settings of ``data_dir`` with its SQLite database migrated to head."""
    settings = Settings(
        data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'qinglong.db'}", profile=EDGE
    )
    settings.ensure_data_dir()
    engine = make_engine(settings.database_url)
    try:
        upgrade_to_head(engine)
    finally:
        engine.dispose()
    return settings


def test_api_workers_serve_the_data_dir_given_by_flag(tmp_path: Path, short_dir: Path) -> None:
    data_dir = tmp_path / "flagged"
    settings = _migrated(data_dir)
    engine = make_engine(settings.database_url)
    try:
        token = new_api_token()
        TokenRepository(engine).create(name="admin", scopes=frozenset({"admin"}), token=token)
    finally:
        engine.dispose()
    # No QL_DATA_DIR: without the flag reaching the workers they would open ./.qinglong.
    with _api(tmp_path, short_dir, data_dir, "2") as port:
        base, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
        for _ in range(4):  # new connections: each worker in turn may take one
            put = web.put(
                f"{base}/api/v1/tasks/t/revisions/1", json={"argv": ["/bin/true"]},
                headers=auth | {"Connection": "close"}, timeout=10,
            )  # fmt: skip
            assert put.status_code in (200, 201), put.text
    engine = make_engine(settings.database_url)
    try:
        assert DefinitionRepository(engine).latest_revision("t").revision == 1
    finally:
        engine.dispose()
    assert not (tmp_path / ".qinglong").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_uvicorn_s_own_lines_come_in_the_service_log_format(
    tmp_path: Path, short_dir: Path, workers: str
) -> None:
    # Before: uvicorn's handler wrote its lines its own way, `WARNING:  Invalid HTTP request
    # received.` for every malformed request (a port scanner's), `ERROR:    New child
    # process [..] was not ready in time; ... aborting the restart.` for a rolling restart
    # that did not take: no time, no role, among the service's timed lines; and the first
    # one for each malformed request, so a scanner's burst wrote as many lines.
    data_dir = tmp_path / "data"
    _migrated(data_dir)
    log = tmp_path / "api.log"
    with _api(tmp_path, short_dir, data_dir, workers) as port:
        for _ in range(8):  # a scanner's burst: one line per process and 10 s, not eight
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                conn.sendall(b"GARBAGE\x00 / NOTHTTP\r\n\r\n")
                assert conn.recv(64).startswith(b"HTTP/1.1 400 ")
        deadline = time.monotonic() + 10
        while "Invalid HTTP request" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = log.read_text().splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} api (INFO|WARNING|ERROR) "
    assert [line for line in lines if not re.match(stamp, line)] == []
    said = stamp + r"Invalid HTTP request received\. \(one such line per 10 s at most\)"
    assert 1 <= len([x for x in lines if re.fullmatch(said, x)]) <= int(workers)
    assert len([x for x in lines if "Invalid HTTP request" in x]) <= int(workers)
