"""The job user for tests (docs/job-user.md): ``nobody`` when the suite runs as root.

``job_user_or_skip`` skips with a visible reason when the suite is not root or ``nobody`` does
not exist, unless ``QL_TEST_JOB_USER_REQUIRED=1`` (CI, which runs as root) makes that a
failure. ``reachable_dir`` makes a directory the job user can traverse, for data dirs and
working directories: pytest's own tmp dirs are 0700 and would refuse the job for the wrong
reason (a test must see the data dir's own modes refuse it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

JOB_USER = "nobody"
JOB_UID = 65534


def job_user_or_skip() -> str:
    """``nobody``, or skip (fail when QL_TEST_JOB_USER_REQUIRED=1) where it cannot be used."""
    reason = None
    if os.geteuid() != 0:
        reason = "jobs as another user need a root test run (CI runs as root)"
    else:
        try:
            if pwd.getpwnam(JOB_USER).pw_uid != JOB_UID:
                reason = f"{JOB_USER} is not uid {JOB_UID} here"
        except KeyError:
            reason = f"no user {JOB_USER} on this host"
    if reason is None:
        return JOB_USER
    if os.environ.get("QL_TEST_JOB_USER_REQUIRED") == "1":
        pytest.fail(f"QL_TEST_JOB_USER_REQUIRED=1 but {reason}")
    pytest.skip(reason)


@contextmanager
def reachable_dir(prefix: str = "ql-jobuser-") -> Iterator[Path]:
    """A fresh directory under the system temp dir that others may traverse (0711), removed
    afterwards; what is made inside it keeps its own (private) modes."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        path.chmod(0o711)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
