"""Fixtures of the worker tests: short socket dirs, process cleanup by identity."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.kit import Processes


@pytest.fixture
def procs() -> Iterator[Processes]:
    """Tracks launched processes and kills survivors (by verified identity) at teardown."""
    tracker = Processes()
    try:
        yield tracker
    finally:
        tracker.cleanup()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short private directory (Unix socket paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ql"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
