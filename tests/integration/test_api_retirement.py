"""A real ``qinglong api`` told to stop (SIGTERM) lets keep-alive connections finish.

One process, one uvicorn worker, raw keep-alive connections: deterministic, unlike a load
test. Without app/api/retirement.py uvicorn closes both idle connections at once.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.api.retirement import IDLE_GRACE_S
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from tests.e2e.conftest import REPO_ROOT, free_port, wait_until

START_TIMEOUT_S = 60.0


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``qinglong api --workers 1`` on a free 127.0.0.1 port (no worker: none is needed)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'qinglong.db'}")
    upgrade_to_head(engine)
    engine.dispose()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_DATA_DIR": str(tmp_path), "QL_WORKER_SOCKET": str(tmp_path / "w.sock")}
    argv = [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", str(port)]
    with (tmp_path / "api.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        wait_until("the api to answer", lambda: _healthz_once(port), START_TIMEOUT_S)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()  # our unreaped child: the pid is still ours
        proc.wait(timeout=30)


def _healthz_once(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _get(conn: http.client.HTTPConnection) -> http.client.HTTPResponse:
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    response.read()
    return response


def test_a_retiring_api_answers_idle_connections_with_close_and_closes_silent_ones_late(
    api: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = api
    talking = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    silent = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        _retire_with(proc, port, talking, silent)
    finally:
        talking.close()
        silent.close()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _retire_with(
    proc: subprocess.Popen[bytes],
    port: int,
    talking: http.client.HTTPConnection,
    silent: http.client.HTTPConnection,
) -> None:
    first = _get(talking)
    assert (first.status, first.will_close) == (200, False)
    assert _get(silent).status == 200
    assert silent.sock is not None

    os.kill(proc.pid, signal.SIGTERM)
    told = time.monotonic()
    # It stops accepting (one worker, nothing else listens on the port); uvicorn tells every
    # open connection to shut down in the same step as it closes the listener.
    wait_until("the listener to close", lambda: _refused(port), 10)

    # Idle when the stop began, used again: answered, and told to reconnect.
    last = _get(talking)
    assert (last.status, last.will_close) == (200, True)
    assert last.getheader("connection") == "close"
    # The silent one stays open for the grace, then the server closes it.
    silent.sock.settimeout(IDLE_GRACE_S + 10)
    assert silent.sock.recv(1) == b""
    assert time.monotonic() - told >= IDLE_GRACE_S - 0.1
    proc.wait(timeout=30)
