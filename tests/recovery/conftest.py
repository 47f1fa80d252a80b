"""Fixtures of the crash-survival tests: a real worker subprocess per test, cleaned by pid."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.recovery.kit import Rig
from tests.worker.kit import Processes


@pytest.fixture
def procs() -> Iterator[Processes]:
    """Launched jobs and other processes; survivors are killed by verified identity."""
    tracker = Processes()
    try:
        yield tracker
    finally:
        tracker.cleanup()


@pytest.fixture
def rig(engine: Engine, db_url: str, tmp_path: Path, procs: Processes) -> Iterator[Rig]:
    """A data dir, the database and a (not yet started) worker; everything ends by pid."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    short = Path(tempfile.mkdtemp(prefix="ql"))  # socket paths must stay short
    r = Rig(engine, db_url, data_dir, short / "w.sock", procs)
    try:
        yield r
    finally:
        r.worker.close()
        shutil.rmtree(short, ignore_errors=True)
