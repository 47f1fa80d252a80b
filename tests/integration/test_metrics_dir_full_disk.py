"""``qinglong api`` whose ``metrics/`` cannot be made (a full disk) serves, and ``/metrics``
answers the database figures: docs/metrics.md § A full disk.

The data dir is one restored from a backup (docs/operations.md §3: ``secret.key`` and
``instance-id``, no ``metrics/``) on a real tmpfs with one inode left: the api's lock file
takes it, as a file that needs no block would on ext4, and the directory, which needs one
there, cannot be made. Before, that ``mkdir`` ended the api in a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from app.domain.tokens import new_api_token
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.secret_crypto import KeyRing
from app.storage.tokens_repo import TokenRepository
from app.worker.instance import instance_id
from tests.disk import mounted_tmpfs
from tests.e2e.conftest import REPO_ROOT, free_port, wait_until
from tests.e2e.test_supervisor import uvicorn_workers
from tests.kit import web


def _use_every_inode_but_one(fs: Path) -> None:
    filler = fs / "inodes"
    filler.mkdir()
    n = 0
    with contextlib.suppress(OSError):
        while True:
            (filler / str(n)).touch()
            n += 1
    (filler / str(n - 1)).unlink()


def test_an_api_that_cannot_make_its_metrics_dir_serves_and_scrapes_answer(
    tmp_path: Path, short_dir: Path,
) -> None:  # fmt: skip
    url = f"sqlite:///{tmp_path / 'q.db'}"  # the database has room; the data dir has none
    engine = make_engine(url)
    upgrade_to_head(engine)
    token = new_api_token()
    TokenRepository(engine).create(name="m", scopes=frozenset({"metrics:read"}), token=token)
    engine.dispose()
    with mounted_tmpfs(tmp_path / "fs", size_mib=8, inodes=64) as fs:
        data = fs / "data"
        data.mkdir(mode=0o700)
        KeyRing.from_settings(secret_key=None, key_file=data / "secret.key")
        instance_id(data)
        _use_every_inode_but_one(fs)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        env |= {"QL_DATA_DIR": str(data), "QL_DATABASE_URL": url,
                "QL_WORKER_SOCKET": str(short_dir / "w.sock")}  # fmt: skip
        argv = [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", str(port),
                "--workers", "2"]  # fmt: skip
        log = tmp_path / "api.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        try:

            def up() -> bool:
                assert proc.poll() is None, log.read_text()  # before: a traceback, exit 1
                return len(uvicorn_workers(proc.pid)) == 2 and _healthz(port)

            wait_until("two uvicorn workers answering", up, 60)
            for _ in range(6):  # fresh connections: either worker may answer
                with httpx.Client(timeout=10) as fresh:
                    got = fresh.get(f"http://127.0.0.1:{port}/metrics",
                                    headers={"Authorization": f"Bearer {token}"})  # fmt: skip
                assert got.status_code == 200, got.text
                assert "qinglong_runs_ended" in got.text  # the database figures
                assert "qinglong_dispatch_pass_seconds" not in got.text  # no process's
            assert not (data / "metrics").exists()
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            finally:
                for pid in uvicorn_workers(proc.pid) if proc.poll() is None else ():
                    os.kill(pid, signal.SIGKILL)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
    said = log.read_text()
    assert "Traceback" not in said, said
    lines = [line for line in said.splitlines() if "metrics:" in line]
    assert len(lines) == 3, said  # the api's, at its start, then each worker's
    assert lines[0].endswith(
        f"api WARNING metrics: cannot make {data}/metrics (No space left on device): no api "
        "worker keeps observations; GET /metrics reports the database figures only until the "
        "api restarts with room (docs/metrics.md)"
    )
    for line in lines[1:]:
        assert line.endswith(": No such file or directory); nor does any other: there is no "
                             "metrics directory (docs/metrics.md)"), line  # fmt: skip


def _healthz(port: int) -> bool:
    try:
        return web.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
