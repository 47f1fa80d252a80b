"""Issue 13 §1's attack chain, run as a job of a real ``qinglong serve`` (docs/job-user.md).

An attacker who may only define and run tasks tried, from the job's own shell: to list the
data dir, read the key file, the database and its WAL, connect to the worker socket, list
the shim's open files through ``/proc/$PPID/fd``, signal the shim, and mint an admin token
with the service's own ``qinglong token create`` against the data dir. With
``QL_JOB_USER=nobody`` each step must fail; the job is uid 65534, its output still reaches
the log, its exit code is exact, and its per-job HOME (0700, its own) is gone afterwards.

The same script with no job user configured is the control: there every step that the
service's own user may do succeeds, so each probe below can tell access from refusal.
The data dir and the socket live in directories anyone may traverse, so the refusals come
from the service's own modes, not from pytest's private tmp dirs.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from app.storage.engine import make_engine
from tests.e2e.conftest import ServeFactory, wait_until
from tests.e2e.kit import enqueue, put_task, read_log, wait_status
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir
from tests.kit import web

REPO = Path(__file__).resolve().parents[2]
PROBES = ("data-dir", "secret.key", "qinglong.db", "qinglong.db-wal", "socket", "shim-fd",
          "shim-signal", "token")  # fmt: skip
EXIT = 42


def _python_for_job() -> tuple[str, str]:
    """An interpreter the job user may run, and the PYTHONPATH that gives it this checkout
    (the venv's own python may sit under a private home; the system one of the same minor
    version loads the venv's packages)."""
    site = Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                "site-packages")  # fmt: skip
    system = Path(f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}")
    python = str(system) if system.exists() else sys.executable
    return python, f"{site}:{REPO}"


def _script(data_dir: Path, socket_path: Path) -> str:
    python, path = _python_for_job()
    probe = 'if {cmd} >/dev/null 2>&1; then echo "OPEN {name}"; else echo "DENIED {name}"; fi'
    steps = [
        ("data-dir", f"ls '{data_dir}'"),
        *((name, f"cat '{data_dir / name}'") for name in ("secret.key", "qinglong.db",
                                                          "qinglong.db-wal")),
        ("socket", f"{python} -c 'import socket,sys; socket.socket(socket.AF_UNIX)"
                   f".connect(sys.argv[1])' '{socket_path}'"),
        ("shim-fd", 'ls "/proc/$PPID/fd"'),
        ("shim-signal", 'kill -0 "$PPID"'),
        ("token", f"PYTHONPATH='{path}' {python} -m app --data-dir '{data_dir}' token create "
                  "--scope admin --name stolen"),
    ]  # fmt: skip
    lines = ['echo "uid=$(id -u)"', 'echo "home=$HOME $(stat -c %u:%a "$HOME")"']
    lines += [probe.format(cmd=cmd, name=name) for name, cmd in steps]
    lines.append(f"exit {EXIT}")
    return "\n".join(lines)


def _tokens_named(db_url: str, name: str) -> int:
    from sqlalchemy import text

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM api_tokens WHERE name = :n"),
                                    {"n": name}).scalar_one())  # fmt: skip
    finally:
        engine.dispose()


@pytest.mark.e2e
@pytest.mark.parametrize("job_user", ["nobody", None], ids=["job-user", "same-user"])
def test_the_attack_chain_fails_at_every_step_when_jobs_run_as_the_job_user(
    serve_factory: ServeFactory, job_user: str | None
) -> None:
    if job_user is not None:
        job_user = job_user_or_skip()
    with reachable_dir() as root:
        data_dir = root / "data"
        served = serve_factory(
            data_dir=data_dir, extra_env={"QL_JOB_USER": job_user} if job_user else {}
        )
        served.socket_path.parent.chmod(0o711)  # only the socket's own 0600 may refuse
        base, auth = served.base_url, served.auth
        ready = web.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        isolation = ready.json()["isolation"]
        assert isolation == ("job_user" if job_user else "same_user")
        r = web.put(f"{base}/api/v1/secrets/victim", json={"value": "v" * 20}, headers=auth)
        assert r.status_code == 204, r.text
        for name in ("secret.key", "qinglong.db", "qinglong.db-wal"):
            assert (data_dir / name).exists(), name  # each probe has something to find
        put_task(served, "attack", _script(data_dir, served.socket_path))
        run_id = enqueue(served, "attack")
        run = wait_status(served, run_id, {"succeeded", "failed", "lost"}, timeout=60)
        log = read_log(served, run_id).decode()
        served.stop()
        db_url = f"sqlite:///{data_dir / 'qinglong.db'}"
        stolen = _tokens_named(db_url, "stolen")

    assert run["status"] == "failed", run
    assert run["latest_attempt"]["exit_code"] == EXIT, run
    results = dict(line.split(" ", 1)[::-1] for line in log.splitlines() if " " in line
                   and line.split(" ", 1)[0] in ("OPEN", "DENIED"))  # fmt: skip
    assert set(results) == set(PROBES), log
    if job_user is None:
        assert f"uid={os.geteuid()}" in log
        same_user_may = set(PROBES) - ({"shim-fd"} if os.geteuid() != 0 else set())
        assert {p for p in same_user_may if results[p] != "OPEN"} == set(), log
        assert stolen == 1
        return
    assert f"uid={JOB_UID}" in log, log
    assert {p: r for p, r in results.items() if r != "DENIED"} == {}, log
    assert stolen == 0
    home = re.search(r"^home=(\S+) (\d+):(\d+)$", log, re.M)
    assert home is not None, log
    assert home.group(2, 3) == (str(JOB_UID), "700"), log
    # Its remover is not waited for (the ending never waits on it): gone soon after.
    wait_until("the per-job HOME to go", lambda: not Path(home.group(1)).exists(), 10)
