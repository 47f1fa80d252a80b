"""A built wheel installed into a fresh venv outside the checkout is a working ``qinglong``.

Builds the wheel from a copy of exactly what the Dockerfile copies (pyproject.toml, README.md,
app/), installs it into a new venv in tmp_path (dependencies from the pip cache / configured
index), then from a cwd outside the checkout, without PYTHONPATH or any QL_ variable of this
environment: ``qinglong migrate``, ``qinglong token bootstrap``, ``qinglong serve``, one run
over HTTP, its log, the installed client's ``qinglong runs show`` of it, and a SIGTERM stop that
leaves nothing behind (docs/packaging.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO_ROOT, Served, free_port, spawn_served
from tests.e2e.kit import enqueue, put_task, read_log, wait_status
from tests.kit import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # one to three minutes, mostly pip

INSTALL_TIMEOUT_S = 600  # a cold pip cache downloads every dependency
# The first start compiles what it imports (the install compiled nothing), on a loaded machine.
FIRST_START_TIMEOUT_S = 120.0

# What a wheel must carry for `qinglong migrate` and a job launch to work without a checkout.
PACKAGE_DATA = (
    "app/py.typed",
    "app/storage/migrations/env.py",
    "app/storage/migrations/script.py.mako",
    "app/storage/migrations/versions/0001_initial.py",
    "app/worker/shim.py",
    # The web UI (docs/ui.md): tests/unit/test_ui_static.py holds every file to the globs.
    "app/ui/static/index.html",
    "app/ui/static/js/main.js",
    "app/ui/static/js/pages/run.js",
    "app/ui/static/i18n/zh-CN.json",
)


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that could point the install back at the checkout."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("QL_")}
    return env | extra


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    result = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"{argv} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    )
    return result.stdout


def _build_wheel(tmp_path: Path, env: dict[str, str]) -> Path:
    # A copy, so the build neither writes build/ into the checkout nor packs a stale file left
    # there by an earlier build.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, src / name)
    shutil.copytree(REPO_ROOT / "app", src / "app", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        cwd=tmp_path,
        env=env,
        timeout=INSTALL_TIMEOUT_S,
    )
    (wheel,) = dist.glob("qinglong_control-*.whl")
    return wheel


def test_a_built_wheel_installed_outside_the_checkout_migrates_serves_and_runs_a_job(
    tmp_path: Path,
) -> None:
    assert not tmp_path.resolve().is_relative_to(REPO_ROOT), "the venv must be outside the checkout"
    outside = tmp_path / "cwd"
    outside.mkdir()
    # A user's own project folder may hold a package named ``app``: the installed services
    # must still import their own code, never the one in the directory they start from.
    (outside / "app").mkdir()
    (outside / "app" / "__init__.py").write_text('raise SystemExit("imported the cwd app/")\n')
    data_dir = tmp_path / "data"
    socket_dir = Path(tempfile.mkdtemp(prefix="ql"))  # Unix socket paths stay short
    env = _clean_env(QL_DATA_DIR=str(data_dir), QL_WORKER_SOCKET=str(socket_dir / "w.sock"))
    venv = tmp_path / "venv"
    try:
        wheel = _build_wheel(tmp_path, env)
        names = set(zipfile.ZipFile(wheel).namelist())
        assert set(PACKAGE_DATA) <= names, sorted(set(PACKAGE_DATA) - names)

        # No pip of its own and no .pyc compiled at install: the two slowest parts of a fresh
        # install that a user's `pip install` has too but this test need not pay for.
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=outside, env=env)
        python, qinglong = venv / "bin" / "python", venv / "bin" / "qinglong"
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "-q",
                "--no-compile",
                str(wheel),
            ],
            cwd=outside,
            env=env,
            timeout=INSTALL_TIMEOUT_S,
        )

        # The installed code, its migrations and its shim are the venv's, not the checkout's.
        where = _run(
            [
                str(python),
                "-P",  # as a user's own `python -c` from this folder would, minus its app/
                "-c",
                "import app, app.storage.migrate as m, app.worker.launcher as l;"
                " print(app.__file__); print(m.migrations_dir()); print(l.SHIM_PATH)",
            ],
            cwd=outside,
            env=env,
        ).split()
        site = venv.resolve()
        for path in where:
            assert Path(path).resolve().is_relative_to(site), where

        assert "migrated" in _run([str(qinglong), "migrate"], cwd=outside, env=env)
        token = _run([str(qinglong), "token", "bootstrap"], cwd=outside, env=env).split()[-1]

        served = _serve(qinglong, outside, env, data_dir, socket_dir, token)
        try:
            put_task(served, "hello", "echo hello-from-the-wheel")
            run_id = enqueue(served, "hello")
            run = wait_status(served, run_id, {"succeeded", "failed", "lost"}, timeout=60)
            assert run["status"] == "succeeded", run
            assert read_log(served, run_id) == b"hello-from-the-wheel\n"
            # The client commands run from the install too (httpx is a runtime dependency).
            shown = _run(
                [str(qinglong), "runs", "show", run_id, "--json", "--url", served.base_url],
                cwd=outside, env=env | {"QL_TOKEN": token},
            )  # fmt: skip
            assert json.loads(shown)["status"] == "succeeded"
            ui = web.get(f"{served.base_url}/ui/js/main.js", timeout=10)
            assert ui.status_code == 200 and "javascript" in ui.headers["content-type"]
        finally:
            code = served.stop()
        assert code == 0, served.log()
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(venv, ignore_errors=True)  # ~100 MB; the logs stay for a failure


def _serve(
    qinglong: Path, cwd: Path, env: dict[str, str], data_dir: Path, socket_dir: Path, token: str
) -> Served:
    port = free_port()
    served = spawn_served(
        [str(qinglong), "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=cwd, env=env, data_dir=data_dir, socket_dir=socket_dir, token=token, port=port,
        log_path=data_dir / "serve.log",
    )  # fmt: skip
    proc = served.proc
    deadline = time.monotonic() + FIRST_START_TIMEOUT_S
    while not served._up():
        if proc.poll() is not None or time.monotonic() > deadline:
            served.stop()
            pytest.fail(f"the installed qinglong serve did not come up:\n{served.log()}")
        time.sleep(0.05)
    return served
