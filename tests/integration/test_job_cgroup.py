"""How the job gets into its own cgroup (docs/leftovers.md), against the real shim.

The shim starts the job with clone3(CLONE_INTO_CGROUP): the job is born in ``ql-<attempt>``
and the shim never enters it. Where clone3 cannot do that, the shim falls back to moving
itself in, spawning, and moving back; the spec's ``no_clone3`` test hook forces that path, so
both run here (``start``), with and without a job user. Skipped, with the reason, where this
host has no writable cgroup v2 hierarchy. Every cgroup a test causes is checked removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.domain.ids import uuid7
from app.worker import cgroups
from app.worker.identity import read_identity
from tests.integration.conftest import Launched
from tests.integration.kit import (
    DEADLINE,
    SHIM,
    fd_targets,
    make_spec,
    poll_until,
    receipt_path,
    wait_shim_done,
)
from tests.integration.test_shim import launch
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir

# The job's own cgroup and its parent's (the shim) as the job sees them first thing, its uid,
# then a background child (pid, start ticks) left for the shim to kill once the job exits.
SCRIPT = (
    "grep ^0:: /proc/self/cgroup; grep ^0:: /proc/$PPID/cgroup; id -u; "
    'sleep 307 & echo $! $(cut -d" " -f22 /proc/$!/stat); '
    "while [ ! -e go ]; do sleep 0.01; done; exit 0"
)


def _root() -> str:
    root = cgroups.detect(cgroups.AUTO)
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    return str(root.path)


def _cgroup_of(pid: int | str) -> str:
    """The cgroup v2 path of a process (the ``0::`` line of /proc/<pid>/cgroup)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line[3:] for line in lines if line.startswith("0::"))


def _hook(start: str) -> dict[str, Any]:
    return {"test_hook": "no_clone3"} if start == "migrate" else {}


@pytest.mark.parametrize("user", ["service", "job-user"])
@pytest.mark.parametrize("start", ["clone3", "migrate"])
def test_the_job_is_born_in_its_cgroup_and_the_shim_never_stays_in_it(
    tmp_path: Path, launched: Launched, start: str, user: str
) -> None:
    root = _root()
    job = None
    if user == "job-user":
        job_user_or_skip()
        job = {"uid": JOB_UID, "gid": JOB_UID, "umask": 0o027, "home": None, "home_root": "/tmp"}
    with reachable_dir() as work:  # the job's cwd, which the job user may enter too
        spec = make_spec(
            tmp_path, ["/bin/sh", "-c", SCRIPT], cwd=str(work), cgroup_root=root, job=job,
            **_hook(start),
        )  # fmt: skip
        status = launch(spec, launched)
        assert status["ok"] is True, status
        name = f"{cgroups.PREFIX}{spec['attempt_id']}"
        assert status["cgroup"] == name
        launched.track_cgroup(name)  # only if the test fails: ended and removed at cleanup
        log = Path(spec["log_path"])
        poll_until(lambda: len(log.read_text().splitlines()) >= 4)
        own, parent, uid, child = log.read_text().splitlines()[:4]
        child_pid, child_ticks = map(int, child.split())
        launched.track_pid(child_pid)
        assert own.endswith(f"/{name}"), own  # born inside: the first thing it sees
        assert int(uid) == (os.geteuid() if job is None else JOB_UID)
        if start == "clone3":  # the shim never entered; the fallback left it a moment later
            assert not parent.endswith(f"/{name}"), parent
        members = (Path(root) / name / "cgroup.procs").read_text().split()
        assert str(status["pid"]) in members and str(child_pid) in members
        assert str(status["shim_pid"]) not in members
        assert not _cgroup_of(status["shim_pid"]).endswith(f"/{name}")
        (work / "go").touch()
        wait_shim_done(status)
    receipt = json.loads(receipt_path(spec).read_bytes())
    assert receipt["exitCode"] == 0 and receipt["leftoversStopped"] == 1
    ident = read_identity(child_pid)
    assert ident is None or ident.start_ticks != child_ticks, "the leftover outlived the job"
    assert not (Path(root) / name).exists(), "the job's cgroup was left behind"
    if job is not None:  # the per-job HOME goes with the job (its remover is not waited for)
        poll_until(lambda: not list(Path("/tmp").glob(f"ql-home-{spec['attempt_id']}-*")))


_ENV = {"PATH": "/nonexistent:/bin:/usr/bin", "BETA": "two words", "EMPTY": ""}


def _fds(out: str, spec: dict[str, Any]) -> None:
    targets = fd_targets(spec["log_path"])
    assert set(targets) <= {0, 1, 2, 3}, targets  # fd 3: the directory ls opened to list
    assert targets[0] == "/dev/null"
    assert targets[1] == targets[2] and targets[1].startswith("pipe:")


# glibc's own two internal signals (32, 33): posix_spawn leaves them ignored in the child,
# and the shim's clone3 child cannot reset them either (glibc's sigaction refuses them), so
# they stay ignored when the shim inherited them so (a process tree with a posix_spawn in
# its ancestry: CI's is one). Harmless: a glibc program installs its own handlers for them.
_GLIBC_INTERNAL = (1 << 31) | (1 << 32)


def _signals(out: str, spec: dict[str, Any]) -> None:  # nothing blocked, nothing ignored
    masks = dict(line.split(":\t") for line in out.splitlines())
    assert int(masks["SigBlk"], 16) == 0
    ignored = int(masks["SigIgn"], 16)
    assert ignored & ~_GLIBC_INTERNAL == 0, masks


def _env(out: str, spec: dict[str, Any]) -> None:
    assert sorted(out.splitlines()) == sorted(f"{k}={v}" for k, v in _ENV.items())


def _cwd(out: str, spec: dict[str, Any]) -> None:  # "pwd" found through the job's PATH
    assert out == f"{spec['cwd']}\n"


@pytest.mark.parametrize("start", ["clone3", "migrate"])
@pytest.mark.parametrize(
    ("argv", "check"),
    [
        (["/bin/ls", "-l", "/proc/self/fd/"], _fds),
        (["/bin/grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"], _signals),
        (["/usr/bin/env"], _env),
        (["pwd"], _cwd),
    ],
    ids=["fds", "signals", "env", "path-and-cwd"],
)
def test_the_job_starts_as_posix_spawn_would_start_it(
    tmp_path: Path, launched: Launched, start: str, argv: list[str], check: Any
) -> None:
    """With clone3 the shim's own child code replaces posix_spawn: the same fds, signals,
    env, process group, cwd and PATH lookup (test_shim.py checks them without a cgroup)."""
    root = _root()
    spec = make_spec(tmp_path, argv, cgroup_root=root, env=_ENV, **_hook(start))
    status = launch(spec, launched)
    assert status["ok"] is True, status
    assert status["cgroup"] is not None
    launched.track_cgroup(status["cgroup"])
    wait_shim_done(status)
    assert json.loads(receipt_path(spec).read_bytes())["exitCode"] == 0
    assert status["pgid"] == status["pid"]  # its own process group from the start
    check(Path(spec["log_path"]).read_text(), spec)
    assert not (Path(root) / status["cgroup"]).exists()


@pytest.mark.parametrize("start", ["clone3", "migrate"])
@pytest.mark.parametrize(
    ("over", "error", "errno_"),
    [
        ({"argv": ["/nonexistent/prog"]}, "EXEC_FAILED", 2),
        ({"argv": ["no-such-command-here"]}, "EXEC_FAILED", 2),
        ({"cwd": "/nonexistent/dir"}, "CWD_INVALID", 2),
    ],
    ids=["missing-path", "not-on-path", "missing-cwd"],
)
def test_a_job_that_cannot_start_leaves_no_cgroup(
    tmp_path: Path, launched: Launched, start: str, over: dict[str, Any], error: str, errno_: int
) -> None:
    root = _root()
    spec = make_spec(tmp_path, ["/bin/true"], cgroup_root=root, **_hook(start))
    spec.update(over)
    assert launch(spec, launched) == {"ok": False, "error": error, "errno": errno_}
    assert not (Path(root) / f"{cgroups.PREFIX}{spec['attempt_id']}").exists()
    assert list(Path(spec["receipt_dir"]).iterdir()) == []  # no job, no reservation left


# Run in a fresh interpreter as the shim runs (single-threaded, -I -S): the clone3 start itself.
_HARNESS = """
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import shim
cgroup, elsewhere = sys.argv[2], sys.argv[3]
spec = {"argv": ["/bin/sh", "-c", "grep ^0:: /proc/self/cgroup"], "env": {}, "cwd": None}
before = open("/proc/self/cgroup").read()
read_fd, write_fd = os.pipe()
refused = shim._spawn_into(spec, write_fd, None, elsewhere)
pid = shim._spawn_into(spec, write_fd, None, cgroup)
os.close(write_fd)
out = b""
while chunk := os.read(read_fd, 4096):
    out += chunk
status = os.waitpid(pid, 0)[1] if pid else None
print(refused, pid is not None, status, out.decode().strip(), before == open("/proc/self/cgroup").read())
"""


def test_clone3_starts_the_job_in_the_cgroup_and_a_refusal_means_the_fallback(
    tmp_path: Path,
) -> None:
    root = _root()
    release = tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit())
    if os.uname().machine not in ("x86_64", "aarch64") or release < (5, 7):
        pytest.skip("clone3 with CLONE_INTO_CGROUP needs Linux >= 5.7 on x86_64 or aarch64")
    cgroup = Path(root) / f"qltest-clone3-{uuid7()}"
    cgroup.mkdir()
    try:
        not_a_cgroup = tmp_path / "plain-dir"  # clone3 refuses its fd (EBADF): no child
        not_a_cgroup.mkdir()
        argv = [sys.executable, "-I", "-S", "-c", _HARNESS, SHIM, str(cgroup), str(not_a_cgroup)]
        out = subprocess.run(argv, capture_output=True, timeout=DEADLINE, check=True, env={})
        refused, started, status, seen, unmoved = out.stdout.decode().split()
        assert refused == "None"  # the caller then migrates the shim instead
        assert started == "True" and status == "0"
        assert seen.endswith(f"/{cgroup.name}"), seen
        assert unmoved == "True"  # the starting process never changed its cgroup
        assert (cgroup / "cgroup.procs").read_text() == ""
    finally:
        cgroup.rmdir()
