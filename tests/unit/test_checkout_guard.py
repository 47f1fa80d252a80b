"""The session guard of tests/conftest.py: what it counts as a file the run left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import checkout_entries, gained_entries


def _tree(root: Path) -> None:
    for rel in ("app/mod.py", "docs/a.md", ".venv/bin/python", "app/__pycache__/m.pyc",
                ".pytest_cache/x", "pkg.egg-info/PKG-INFO", ".coverage.host.1"):  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")


def test_without_git_the_root_and_app_are_listed_and_tool_output_left_out(
    tmp_path: Path,
) -> None:
    _tree(tmp_path)  # an unpacked tarball: no .git
    before = checkout_entries(tmp_path)
    assert before == {"app", "docs", "app/mod.py"}
    (tmp_path / "secret.key").write_text("k")
    (tmp_path / "app" / "stray.txt").write_text("x")
    (tmp_path / ".ruff_cache").mkdir()
    assert checkout_entries(tmp_path) - before == {"secret.key", "app/stray.txt"}


def test_in_a_git_checkout_an_untracked_or_ignored_file_anywhere_counts(tmp_path: Path) -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("needs git")
    _tree(tmp_path)
    (tmp_path / ".gitignore").write_text(".venv/\n__pycache__/\n.qinglong/\n")
    subprocess.run([git, "init", "-q", str(tmp_path)], check=True)
    subprocess.run([git, "-C", str(tmp_path), "add", "app/mod.py", "docs", ".gitignore"],
                   check=True)  # fmt: skip
    before = checkout_entries(tmp_path)
    (tmp_path / "docs" / "deep.txt").write_text("x")  # untracked, below the root
    (tmp_path / "docs" / ".qinglong").mkdir()  # ignored, yet no tool's
    (tmp_path / "docs" / ".qinglong" / "secret.key").write_text("k")
    (tmp_path / "docs" / "__pycache__").mkdir()
    (tmp_path / "docs" / "__pycache__" / "x.pyc").write_text("x")
    assert checkout_entries(tmp_path) - before == {"docs/deep.txt", "docs/.qinglong"}


def test_only_a_new_entry_made_since_the_start_is_gained(tmp_path: Path) -> None:
    _tree(tmp_path)
    start = time.time()
    before = checkout_entries(tmp_path)
    (tmp_path / "secret.key").write_text("k")  # made by the run
    (tmp_path / "app" / "stray").mkdir()
    restored = tmp_path / "restored.txt"  # copied back from before the run, its mtime kept
    restored.write_text("x")
    an_hour_ago = start - 3600
    os.utime(restored, (an_hour_ago, an_hour_ago))
    link = tmp_path / "old-link"  # a symlink's own mtime counts, not its target's
    link.symlink_to("secret.key")
    os.utime(link, (an_hour_ago, an_hour_ago), follow_symlinks=False)
    new = {"secret.key", "app/stray", "restored.txt", "old-link"}
    assert checkout_entries(tmp_path) - before == new
    assert gained_entries(before, start, tmp_path) == ["app/stray", "secret.key"]
    assert gained_entries(before, time.time() + 3600, tmp_path) == []  # all before "start"
