"""Fixtures of the crash-survival tests: a real worker subprocess per test, cleaned by pid."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.recovery.kit import Rig
from tests.worker.kit import Processes


@pytest.fixture
def rig(
    engine: Engine, db_url: str, tmp_path: Path, procs: Processes, short_dir: Path
) -> Iterator[Rig]:
    """A data dir, the database and a (not yet started) worker; everything ends by pid."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    r = Rig(engine, db_url, data_dir, short_dir / "w.sock", procs)
    try:
        yield r
    finally:
        r.worker.close()
