"""A real ``qinglong serve`` started from a loose umask keeps every file it makes private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.cli.test_file_modes import LOOSE_UMASK, ql
from tests.e2e.conftest import ServeFactory
from tests.e2e.kit import enqueue, put_task, wait_status
from tests.kit import web


def _modes(root: Path) -> dict[str, int]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            found[str(path.relative_to(root))] = os.lstat(path).st_mode
    return found


@pytest.mark.e2e
def test_every_file_and_directory_of_a_served_data_dir_is_private(
    serve_factory: ServeFactory, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    # The operator's shell has a loose umask: the service must not depend on it.
    made = ql("migrate", data_dir=data_dir)
    assert made.returncode == 0, made.stderr
    old = os.umask(LOOSE_UMASK)
    try:
        served = serve_factory(data_dir=data_dir)
    finally:
        os.umask(old)
    auth = served.auth
    base = served.base_url
    assert web.put(f"{base}/api/v1/secrets/s", json={"value": "v"}, headers=auth).status_code
    recipe = web.post(f"{base}/api/v1/recipes", json={"secrets": {"S": "s"}}, headers=auth)
    put_task(served, "echo", "echo out; echo err >&2", cwd=tmp_path, recipe=recipe.json()["id"])
    run_id = enqueue(served, "echo")
    assert wait_status(served, run_id, {"succeeded", "failed"})["status"] == "succeeded"

    modes = {
        name: mode
        for name, mode in _modes(served.data_dir).items()
        if not name.startswith("serve-")  # the test's own capture of the service's stderr
    }
    # The database, its WAL and shared-memory files exist while the service runs.
    assert {"qinglong.db", "qinglong.db-wal", "qinglong.db-shm", "secret.key"} <= set(modes)
    assert any(name.startswith("logs/") for name in modes)
    assert stat.S_IMODE(os.stat(served.data_dir).st_mode) == 0o700
    loose = {
        name: f"{stat.S_IMODE(mode):04o}"
        for name, mode in modes.items()
        if stat.S_IMODE(mode) != (0o700 if stat.S_ISDIR(mode) else 0o600)
    }
    assert loose == {}
    assert stat.S_IMODE(os.stat(served.socket_path).st_mode) == 0o600
