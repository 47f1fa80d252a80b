"""A real running system for the benchmarks: data dir, database, token, worker, uvicorn api.

Everything binds 127.0.0.1; every process started here is ended by its pid; the data dir
(and a PostgreSQL schema, when one was made) is removed on exit, a SIGTERM's included
(``timeout``, the end of a CI job): it unwinds the stack instead of ending the process at
once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
from sqlalchemy import create_engine, text

from app.domain.tokens import SCOPES, new_api_token
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.tokens_repo import TokenRepository

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 30.0
# The start polls /healthz every 20 ms (also under tests/e2e/test_bench_smoke.py): one SSL
# context, not the new one each httpx.get builds (27 ms of CPU).
_TLS = httpx.create_ssl_context()


@contextlib.contextmanager
def database(pg_base: str | None, data: Path) -> Iterator[str]:
    """A migrated database URL: a SQLite file in ``data``, or a private PostgreSQL schema."""
    if pg_base is None:
        url = f"sqlite:///{data / 'qinglong.db'}"
        engine = make_engine(url)
        upgrade_to_head(engine)
        engine.dispose()
        yield url
        return
    schema = f"ql_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in pg_base else "?"
    url = f"{pg_base}{sep}options={quote(f'-csearch_path={schema}')}"
    try:
        engine = make_engine(url)
        upgrade_to_head(engine)
        engine.dispose()
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(data: Path, url: str) -> dict[str, str]:
    """The process environment: this one minus any QL_*, plus the stack's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_DATA_DIR": str(data), "QL_DATABASE_URL": url}
    env |= {"PYTHONPATH": str(ROOT)}
    return env


def start_worker(data: Path, url: str, *, log: Path | None = None) -> subprocess.Popen[bytes]:
    """``python -m app worker`` on ``data`` (returns once its socket exists)."""
    out = open(log or data / "worker.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [*_python("worker"), "-m", "app", "worker"], cwd=ROOT, env=env_for(data, url),
        stdout=out, stderr=out,
    )  # fmt: skip
    out.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (data / "worker.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"worker did not start: {(data / 'worker.log').read_text()[-2000:]}")
        time.sleep(0.005)
    return proc


def _python(role: str) -> list[str]:
    # QL_BENCH_PROFILE=DIR runs the process under pyinstrument, text profile in DIR/<role>.txt.
    out = os.environ.get("QL_BENCH_PROFILE")
    if not out:
        return [sys.executable]
    path = Path(out) / f"{role}-{os.getpid()}-{time.monotonic_ns()}.txt"
    return [sys.executable, "-m", "pyinstrument", "-r", "text", "--show-all", "-o", str(path)]


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM by pid, then SIGKILL by pid if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


@dataclass
class Stack:
    """A running api + worker on one data dir."""

    data: Path
    url: str
    base_url: str
    token: str

    @property
    def auth(self) -> dict[str, str]:
        """The admin bearer header."""
        return {"Authorization": f"Bearer {self.token}"}


def start_api(data: Path, url: str, port: int, *, http: str = "auto") -> subprocess.Popen[bytes]:
    """uvicorn with the app factory on 127.0.0.1:port (one process, no access log).

    ``http`` is uvicorn's option: its own parser by default, or a protocol class's path.
    """
    out = open(data / "api.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [*_python("api"), "-m", "uvicorn", "app.api.main:create_app", "--factory", "--http", http,
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env_for(data, url), stdout=out, stderr=out,
    )  # fmt: skip
    out.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            ok = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0, verify=_TLS)
            if ok.status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"api did not start: {(data / 'api.log').read_text()[-2000:]}")
        time.sleep(0.02)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # Once: a second SIGTERM (``timeout`` signals its whole process group) must not cut the
    # teardown this one started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the stack runs, SIGTERM raises SystemExit in the main thread, so the teardown
    below runs; Python's default would end the process and leave the data dir behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def running_stack(pg_base: str | None, *, worker: bool = True) -> Iterator[Stack]:
    """Migrate, create an admin token, start the worker and the api; tear all down after."""
    with _sigterm_unwinds():
        yield from _stack(pg_base, worker=worker)


def _stack(pg_base: str | None, *, worker: bool) -> Iterator[Stack]:
    tmp = Path(tempfile.mkdtemp(prefix="qlb"))
    data = tmp / "d"
    data.mkdir(mode=0o700)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with database(pg_base, data) as url:
            engine = make_engine(url)
            token = new_api_token()
            TokenRepository(engine).create(name="bench", scopes=frozenset(SCOPES), token=token)
            engine.dispose()
            try:
                if worker:
                    procs.append(start_worker(data, url))
                port = free_port()
                procs.append(start_api(data, url, port))
                yield Stack(data, url, f"http://127.0.0.1:{port}", token)
            finally:
                for proc in reversed(procs):
                    stop(proc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
