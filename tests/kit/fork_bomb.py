"""A job that tries to start more processes than its limit allows (docs/job-user.md "Process
limit"), for the integration and end-to-end tiers.

``JOB`` is a small Python program (``python -I -S -c JOB MARKER``): it tries to start
``TRIES`` ``sleep MARKER`` children, counts how many started and how many forks were refused
(and how many of those for another reason than EAGAIN), prints
``started=N refused=M other=K`` and exits ``EXIT`` without waiting for them. ``MARKER`` is a
unique sleep duration: ``no_survivors`` finds and kills by exact identity whatever still
runs with it, and fails the test if anything did.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.worker.identity import read_identity
from tests.kit.processes import kill_exact

LIMIT = 10
TRIES = 50
EXIT = 7
JOB = f"""
import errno, os, sys
started = refused = other = 0
for _ in range({TRIES}):
    try:
        pid = os.fork()
    except OSError as exc:
        refused += 1
        other += exc.errno != errno.EAGAIN
        continue
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", sys.argv[1]])
        finally:
            os._exit(127)
    started += 1
print(f"started={{started}} refused={{refused}} other={{other}}", flush=True)
sys.exit({EXIT})
"""


def python_for_job() -> str:
    """A Python the job user may run (the suite's own may live under root's 0700 home)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3 for the job")
    return python


def job_counts(output: str) -> dict[str, int]:
    """The job's ``started=N refused=M other=K`` line as numbers."""
    return {k: int(v) for k, v in (field.split("=") for field in output.split())}


def marked(marker: str) -> list[tuple[int, int]]:
    """(pid, start ticks) of every live process whose argv holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ident = read_identity(int(name))
        if marker.encode() in argv and ident is not None:
            found.append((int(name), ident.start_ticks))
    return found


@contextmanager
def no_survivors() -> Iterator[str]:
    """A fresh marker; afterwards none of its processes may be alive (any is killed)."""
    marker = f"{3000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6:06d}"
    try:
        yield marker
    finally:
        left = marked(marker)
        for pid, ticks in left:
            kill_exact(pid, ticks)
        assert not left, f"{len(left)} children of the job outlived it"
