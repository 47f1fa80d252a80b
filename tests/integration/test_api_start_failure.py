"""``qinglong api`` whose workers cannot start exits non-zero at once with one line, never a
traceback per worker: docs/operations.md §5 (app/api/startup.py).

The failure is a broken install, real in every worker: a dependency that does not import
(a module of that name first on ``PYTHONPATH``). ``psycopg`` is first imported by the
lifespan (the engine of a PostgreSQL URL), ``cronsim`` by the app's import, before the
lifespan; the ``qinglong api`` process itself imports neither. Before, with ``--workers 2``
uvicorn's manager restarted a worker whose import failed forever (a traceback each time, the
port bound, nothing served), and after a failed lifespan waited its 30 s health ping, then
exited 0; with ``--workers 1`` each was a traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.storage.secret_crypto import KeyRing
from app.worker.identity import read_identity
from app.worker.instance import instance_id
from tests.e2e.conftest import REPO_ROOT, free_port, wait_until
from tests.e2e.test_supervisor import uvicorn_workers
from tests.kit.processes import kill_exact, proc_state

# The api's start (the app's import in each spawned worker) takes a few seconds on a busy
# host; uvicorn's manager took 30 s more to notice, or never did.
EXIT_WITHIN_S = 25.0


def _env(data: Path, short_dir: Path, pythonpath: Path, **more: str) -> dict[str, str]:
    """The test's environment with none of ours: ``data`` as the data dir, ``pythonpath``
    (the broken module) first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    return env | {"QL_DATA_DIR": str(data), "QL_WORKER_SOCKET": str(short_dir / "w.sock"),
                  "PYTHONPATH": str(pythonpath), **more}  # fmt: skip


@pytest.mark.parametrize(
    ("workers", "broken", "first_import", "key_file"),
    [
        (2, "psycopg", "app/storage/engine.py", True),  # in the lifespan
        (2, "cronsim", "app/schedule/", True),  # the app's import
        (1, "cronsim", "app/schedule/", True),
        # No key file: `qinglong api` itself asks the database whether it holds secrets,
        # before uvicorn, so it imports the driver first (app/cli/common.py start_step).
        (2, "psycopg", "app/storage/engine.py", False),
    ],
)
def test_an_api_whose_workers_cannot_start_exits_with_one_line(
    tmp_path: Path, short_dir: Path, workers: int, broken: str, first_import: str, key_file: bool
) -> None:
    shadow = tmp_path / "broken"
    (shadow / broken).mkdir(parents=True)
    (shadow / broken / "__init__.py").write_text(f'raise ImportError("this {broken} is broken")\n')
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    # A data dir that ran before: with its key file the api reads no database before its
    # workers start.
    if key_file:
        KeyRing.from_settings(secret_key=None, key_file=data / "secret.key")
    instance_id(data)
    port = free_port()
    closed = free_port()  # nothing listens there: the driver's import fails first anyway
    env = _env(data, short_dir, shadow)
    if broken == "psycopg":
        env["QL_DATABASE_URL"] = f"postgresql+psycopg://ql@127.0.0.1:{closed}/ql"
    argv = [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers)]  # fmt: skip
    log = tmp_path / "api.log"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    seen: dict[int, int] = {}  # pid: start ticks
    try:
        while proc.poll() is None and time.monotonic() - started < EXIT_WITHIN_S:
            seen |= uvicorn_workers(proc.pid)
            time.sleep(0.05)
        code = proc.poll()
        assert code is not None, f"still up after {EXIT_WITHIN_S:.0f} s:\n{log.read_text()}"
    finally:
        _end(proc)
    said = log.read_text()
    assert code == 3, said  # uvicorn's status for a start that failed, never 0
    assert "Traceback" not in said, said
    lines = [line for line in said.splitlines() if "cannot start" in line]
    assert len(lines) == 1, said  # said once, by the api, not by each worker
    assert lines[0].startswith(
        f"qinglong: the api cannot start: ImportError: this {broken} is broken (at {first_import}"
    ), said
    for pid, ticks in seen.items():  # every worker ended with the api
        ident = read_identity(pid)  # a pid in use again on a busy host is another process
        assert ident is None or ident.start_ticks != ticks or proc_state(pid) in ("Z", ""), pid
    with socket.socket() as probe:  # the port is free again: nothing holds it
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))



def test_serve_with_a_driver_that_does_not_import_exits_with_one_line(
    tmp_path: Path, short_dir: Path
) -> None:
    """`qinglong serve` imports the driver itself, to migrate and to ask for stored secrets
    (no key file), before it starts the api: the same line, never a traceback."""
    shadow = tmp_path / "broken"
    (shadow / "psycopg").mkdir(parents=True)
    (shadow / "psycopg" / "__init__.py").write_text('raise ImportError("this psycopg is broken")\n')
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    url = f"postgresql+psycopg://ql@127.0.0.1:{free_port()}/ql"
    env = _env(data, short_dir, shadow, QL_DATABASE_URL=url)
    argv = [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port",
            str(free_port())]  # fmt: skip
    done = subprocess.run(
        argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=EXIT_WITHIN_S,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 3, said
    assert "Traceback" not in said, said
    lines = [line for line in said.splitlines() if "cannot start" in line]
    assert len(lines) == 1, said
    assert lines[0].startswith(
        "qinglong: the api cannot start: ImportError: this psycopg is broken (at app/"
    ), said


def test_an_api_that_served_ends_only_once_no_worker_is_left(
    tmp_path: Path, short_dir: Path
) -> None:
    """Once the api has served, one worker whose replacement cannot start is retried while
    the other serves (tests/unit/test_api_worker_exit.py); when every worker waits for such
    a retry, nothing serves behind the port, so the api ends with one line, status 3."""
    flag = tmp_path / "broken-now"
    port = free_port()
    # cronsim itself until the flag exists (an install broken in place); then an ImportError.
    shadow = _cronsim_unless(
        tmp_path,
        "import os\n"
        f"if os.path.exists({str(flag)!r}):\n"
        "    raise ImportError('this cronsim is broken')\n",
    )
    proc, log = _two_workers(tmp_path, short_dir, shadow, port)
    try:
        wait_until("two workers", lambda: len(uvicorn_workers(proc.pid)) == 2, EXIT_WITHIN_S)
        wait_until("the api answering", lambda: _answers(port), EXIT_WITHIN_S)
        time.sleep(1.5)  # the manager's health pings (every 0.5 s) saw both serve
        flag.touch()
        for pid, ticks in uvicorn_workers(proc.pid).items():
            kill_exact(pid, ticks)
        code = proc.wait(timeout=EXIT_WITHIN_S)
    finally:
        _end(proc)
    said = log.read_text()
    assert code == 3, said
    assert "Traceback" not in said, said
    assert "another in 0.5 s" in said, said  # the first replacement waited for its retry
    ends = [line for line in said.splitlines() if "no api worker is left" in line]
    assert len(ends) == 1 and "ImportError: this cronsim is broken" in ends[0], said


def test_a_worker_that_cannot_start_just_after_another_began_serving_is_retried(
    tmp_path: Path, short_dir: Path
) -> None:
    """A worker whose start fails once another has begun serving, before the manager's next
    health ping (every 0.5 s) saw that one serve, is retried: the manager asks the others
    there and then. It used to end the api with status 3 behind a worker that served."""
    claim, failed = tmp_path / "claim", tmp_path / "failed-once"
    port = free_port()
    # The first worker to import cronsim gets the real one; the second waits until the first
    # serves (the port answers), then fails, once; every later worker gets the real one.
    shadow = _cronsim_unless(
        tmp_path,
        "import os, socket, time\n"
        "try:\n"
        f"    os.close(os.open({str(claim)!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY))\n"
        "    first = True\n"
        "except FileExistsError:\n"
        "    first = False\n"
        f"if not first and not os.path.exists({str(failed)!r}):\n"
        f"    open({str(failed)!r}, 'w').close()\n"
        "    deadline = time.monotonic() + 30\n"
        "    while time.monotonic() < deadline:\n"
        "        try:\n"
        f"            with socket.create_connection(('127.0.0.1', {port}), timeout=1) as c:\n"
        "                c.sendall(b'GET /healthz HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n')\n"
        "                if c.recv(64).startswith(b'HTTP/1.1 200'):\n"
        "                    break\n"
        "        except OSError:\n"
        "            time.sleep(0.01)\n"
        "    raise ImportError('this cronsim is broken once')\n",
    )
    proc, log = _two_workers(tmp_path, short_dir, shadow, port)
    seen: set[int] = set()

    def replaced() -> bool:
        seen.update(uvicorn_workers(proc.pid))
        return proc.poll() is not None or (len(seen) >= 3 and "another in" in log.read_text())

    try:
        wait_until("the failed worker's replacement", replaced, EXIT_WITHIN_S)
        assert proc.poll() is None, log.read_text()
        wait_until(  # the first worker and the replacement each finished its start
            "two workers serving",
            lambda: log.read_text().count("api process ready") >= 2 and _answers(port),
            EXIT_WITHIN_S,
        )
        time.sleep(1.0)  # the manager's pings saw the replacement serve
        assert proc.poll() is None and _answers(port), log.read_text()
        proc.terminate()
        code = proc.wait(timeout=EXIT_WITHIN_S)
    finally:
        _end(proc)
    said = log.read_text()
    assert failed.exists(), said  # the second worker did fail its start once
    assert code == 0, said
    assert "Traceback" not in said and "qinglong: " not in said, said  # no refusal line
    retried = [line for line in said.splitlines() if "another in 0.5 s" in line]
    assert len(retried) == 1 and "ImportError: this cronsim is broken once" in retried[0], said


def _cronsim_unless(tmp_path: Path, prelude: str) -> Path:
    """A directory to put first on ``PYTHONPATH`` whose ``cronsim`` runs ``prelude`` (which
    may raise, as a broken install would), then is the real cronsim."""
    shadow = tmp_path / "shadow"
    (shadow / "cronsim").mkdir(parents=True)
    (shadow / "cronsim" / "__init__.py").write_text(
        prelude + "import sys\n"
        f"sys.path.remove({str(shadow)!r})\n"
        "del sys.modules['cronsim']\n"
        "import cronsim as _real\n"
        "sys.modules['cronsim'] = _real\n"
    )
    return shadow


def _two_workers(
    tmp_path: Path, short_dir: Path, shadow: Path, port: int
) -> tuple[subprocess.Popen[bytes], Path]:
    """``qinglong api --workers 2`` on ``port`` with ``shadow`` first on the path, over a data
    dir that ran before (its key file and instance id); the process and its log."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    KeyRing.from_settings(secret_key=None, key_file=data / "secret.key")
    instance_id(data)
    argv = [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "2"]  # fmt: skip
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=_env(data, short_dir, shadow), stdin=subprocess.DEVNULL,
            stdout=out, stderr=out,
        )  # fmt: skip
    return proc, log


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of an api a test started: its workers (by pid and start time), then it."""
    if proc.poll() is None:
        for pid, ticks in uvicorn_workers(proc.pid).items():
            kill_exact(pid, ticks)
        proc.kill()
        proc.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
            return conn.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def test_a_module_the_api_command_itself_imports_that_is_broken_is_one_line(
    tmp_path: Path, short_dir: Path
) -> None:
    """`qinglong api` imports the metrics client itself (its multiprocess dir), before any
    worker: a broken install there is the same kind of line, never a traceback."""
    shadow = tmp_path / "broken" / "prometheus_client"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("this prometheus_client is broken")\n')
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    KeyRing.from_settings(secret_key=None, key_file=data / "secret.key")
    env = _env(data, short_dir, shadow.parent)
    done = subprocess.run(
        [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", str(free_port())],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=EXIT_WITHIN_S,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 3, said
    assert "Traceback" not in said, said
    assert said.strip().splitlines()[-1].startswith(
        "qinglong: the api command cannot start: ImportError: this prometheus_client is broken"
        " (at app/"
    ), said
