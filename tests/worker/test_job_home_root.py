"""QL_JOB_HOME_ROOT is checked when the worker starts, not by the first job's HOME_FAILED.

Real directories with real modes and owners; the job user is ``nobody`` (root-only run,
tests/jobuser.py). Each refusal is one line naming the root, what is wrong and the user.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.settings import JobUserSettings
from app.worker.job_user import JobUserUnavailable, job_policy
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir


def _settings(root: Path) -> JobUserSettings:
    return JobUserSettings(user=job_user_or_skip(), home_root=root)


@pytest.mark.parametrize(
    ("mode", "owner", "words"),
    [
        (0o755, 0, "is not writable"),  # root's, not the job user's
        (0o777, 0, "is writable by anyone without the sticky bit"),
        (0o1777, 0, None),  # as /tmp
        (0o700, JOB_UID, None),  # the job user's own
    ],
)
def test_a_home_root_the_job_user_cannot_use_refuses_the_worker(
    mode: int, owner: int, words: str | None
) -> None:
    with reachable_dir() as base:
        root = base / "homes"
        root.mkdir()
        os.chown(root, owner, owner)
        root.chmod(mode)
        if words is None:
            assert job_policy(_settings(root)).home_root == root
            return
        with pytest.raises(JobUserUnavailable) as refused:
            job_policy(_settings(root))
    text = str(refused.value)
    assert words in text and str(root) in text and "nobody" in text and "\n" not in text


def test_a_missing_or_symlinked_home_root_refuses_the_worker() -> None:
    with reachable_dir() as base:
        with pytest.raises(JobUserUnavailable, match="does not exist"):
            job_policy(_settings(base / "absent"))
        (base / "link").symlink_to("/tmp")
        with pytest.raises(JobUserUnavailable, match="is a symlink"):
            job_policy(_settings(base / "link"))


def test_a_fixed_job_home_needs_no_home_root() -> None:
    user = job_user_or_skip()
    with reachable_dir() as base:
        settings = JobUserSettings(user=user, home=base, home_root=base / "absent")
        assert job_policy(settings).home == base
