"""The layering of docs/architecture.md §1, checked by import-linter against pyproject's contracts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "import-linter is part of the test extras"
    result = subprocess.run(
        [exe, "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contracts_name_every_rule_of_the_design() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    for rule in (
        "domain is pure standard library",
        "execution depends on protocols only",
        "routes reach only the facade",
        "shim imports nothing from app",
        "the api process never loads the supervisor",
        "the supervisor dispatches nothing",
        "the api reaches the worker through its socket only",
        "the cli client talks HTTP only",
    ):
        assert rule in text
