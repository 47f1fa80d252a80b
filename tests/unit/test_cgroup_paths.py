"""Where job cgroups go: parsing mountinfo and /proc/self/cgroup (pure; app/worker/cgroups.py)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from app.worker.cgroups import cgroup2_mounts, mounted_path, own_cgroup, settle

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def test_only_cgroup2_mounts_are_found_with_optional_fields_and_escapes() -> None:
    assert cgroup2_mounts(HYBRID) == [("/", Path("/sys/fs/cgroup/unified"))]
    assert cgroup2_mounts(UNIFIED) == [("/", Path("/sys/fs/cgroup"))]
    odd = "50 1 0:40 /jobs /mnt/cg\\040v2 rw - cgroup2 none rw\n"
    assert cgroup2_mounts(odd) == [("/jobs", Path("/mnt/cg v2"))]
    assert cgroup2_mounts("garbage\n\n") == []


def test_own_cgroup_is_the_v2_line() -> None:
    text = "4:memory:/x\n0::/system.slice/qinglong-worker.service\n"
    assert own_cgroup(text) == "/system.slice/qinglong-worker.service"
    assert own_cgroup("4:memory:/x\n") is None


def test_the_workers_own_cgroup_is_the_default_root() -> None:
    mounts = cgroup2_mounts(UNIFIED)
    unit = "/system.slice/qinglong-worker.service"
    assert mounted_path(mounts, unit) == Path("/sys/fs/cgroup/system.slice/qinglong-worker.service")
    assert mounted_path(cgroup2_mounts(HYBRID), "/") == Path("/sys/fs/cgroup/unified")
    # A mount of a subtree (e.g. a container's view): the path is taken relative to it.
    sub = [("/jobs", Path("/mnt/cg"))]
    assert mounted_path(sub, "/jobs/worker") == Path("/mnt/cg/worker")
    assert mounted_path(sub, "/jobsworker") is None
    assert mounted_path(sub, "/other") is None
    assert mounted_path(mounts, None) is None
    assert mounted_path([], unit) is None


def test_a_cgroup_removed_mid_read_counts_as_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cgroupfs answers ENODEV, not ENOENT, for a file of a cgroup removed after its open.
    job = tmp_path / "ql-job"
    job.mkdir()
    (job / "cgroup.events").write_text("populated 1\n")
    real = Path.read_text

    def read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.name == "cgroup.events":
            raise OSError(errno.ENODEV, "No such device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert settle(job, patience=0.0, timeout=0.1) is True
