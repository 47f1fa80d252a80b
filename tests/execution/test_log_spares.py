"""The api's log file made ahead and its log shards made at once (docs/design.md §3.4 step 7).

Real files and directories throughout; the one crash window (killed between linking the spare
under the log's name and dropping the spare's own name) is a real SIGKILL of a real process.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.context.execution_wiring import build_execution
from app.domain.artifacts import SHARD_NAMES, log_relpath
from app.execution.materializer import LogSpares, prepare_log_shards
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.identity import read_identity, runs
from tests.disk import mounted_tmpfs
from tests.execution.kit import CountingClient, Kit, MemorySecrets, define, enqueue, make_kit


def _owner(pid: int | None = None) -> tuple[int, int]:
    ident = read_identity(os.getpid() if pid is None else pid)
    assert ident is not None
    return ident.pid, ident.start_ticks


def _spare_names(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith(".spare-"))


def _log_of(kit: Kit, run_id: str) -> Path:
    attempt = kit.run(run_id).latest_attempt
    assert attempt is not None
    return kit.logs_dir / log_relpath(attempt.id)


def _kit(engine: Engine, tmp_path: Path) -> tuple[Kit, LogSpares]:
    spares = LogSpares(tmp_path / "logs", _owner())
    return make_kit(engine, tmp_path / "logs", spares=spares), spares


def _one_run_and_a_spare(engine: Engine, tmp_path: Path) -> tuple[Kit, LogSpares, str, str]:
    """A queued run, a kit whose api holds a spare made ahead; the run id, the spare's name."""
    define(engine)
    run = enqueue(engine)
    kit, spares = _kit(engine, tmp_path)
    assert spares.make()
    [name] = _spare_names(kit.logs_dir)
    return kit, spares, run.id, name


def test_a_launch_links_the_spare_as_its_log(engine: Engine, tmp_path: Path) -> None:
    """The log is the very inode made ahead, under the log's name alone, 0600 and empty."""
    kit, spares, run_id, name = _one_run_and_a_spare(engine, tmp_path)
    made = os.stat(kit.logs_dir / name)
    assert stat.S_IMODE(made.st_mode) == 0o600 and made.st_size == 0

    assert kit.dispatcher.run_pass().activated is not None
    log = os.stat(_log_of(kit, run_id))
    assert (log.st_dev, log.st_ino) == (made.st_dev, made.st_ino)
    assert (stat.S_IMODE(log.st_mode), log.st_size, log.st_nlink) == (0o600, 0, 1)
    assert _spare_names(kit.logs_dir) == []  # its own name is dropped
    assert spares.take() is None  # used once
    assert spares.make() and len(_spare_names(kit.logs_dir)) == 1  # the next one


def test_a_spare_made_long_ago_is_a_fresh_log(engine: Engine, tmp_path: Path) -> None:
    """The orphan rule (an empty log over a minute old is a crash's leftover) must see the
    log of a launch in flight as new, however old its spare was."""
    kit, _spares, run_id, name = _one_run_and_a_spare(engine, tmp_path)
    hour_ago = time.time() - 3600
    os.utime(kit.logs_dir / name, (hour_ago, hour_ago))
    command = kit.materializer().materialize(kit.candidate(run_id))
    assert time.time() - os.stat(command.log_path).st_mtime < 60


def test_a_vanished_spare_leaves_the_ordinary_way(engine: Engine, tmp_path: Path) -> None:
    kit, _spares, run_id, name = _one_run_and_a_spare(engine, tmp_path)
    os.unlink(kit.logs_dir / name)
    assert kit.dispatcher.run_pass().activated is not None
    log = os.stat(_log_of(kit, run_id))
    assert stat.S_ISREG(log.st_mode) and stat.S_IMODE(log.st_mode) == 0o600
    assert _spare_names(kit.logs_dir) == []


def test_a_log_name_taken_already_keeps_the_spare(engine: Engine, tmp_path: Path) -> None:
    """``link`` never replaces: a name already there is refused as ``O_EXCL`` refused it,
    and the spare stays for the next launch."""
    kit, spares, run_id, name = _one_run_and_a_spare(engine, tmp_path)
    made = os.stat(kit.logs_dir / name)
    path = _log_of(kit, run_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.chmod(path, 0o600)
    first = kit.dispatcher.run_pass()
    assert [(o.kind, o.reason) for o in first.outcomes] == [("artifact_refused", "LOG_EXISTS")]
    assert kit.run(run_id).status == "queued"
    assert _spare_names(kit.logs_dir) == [name]
    assert os.stat(path).st_ino != made.st_ino  # the existing file was left alone
    held = spares.take()
    assert held is not None and held.inode == (made.st_dev, made.st_ino)


@pytest.mark.parametrize("swap", ["file", "symlink", "fifo"])
def test_a_spare_name_that_is_no_longer_the_spare_is_not_used(
    engine: Engine, tmp_path: Path, swap: str
) -> None:
    """The linked name must be the very file made ahead: another file, a symlink (never
    followed) or a FIFO (never opened) under the spare's name is linked, taken back, and the
    log created the ordinary way; the other object is left as it was."""
    kit, _spares, run_id, name = _one_run_and_a_spare(engine, tmp_path)
    outside = tmp_path / "outside"
    outside.write_bytes(b"not ours")
    hour_ago = time.time() - 3600
    os.utime(outside, (hour_ago, hour_ago))
    other = kit.logs_dir / "other"
    if swap == "file":
        other.write_bytes(b"")
    elif swap == "symlink":
        os.symlink(outside, other)
    else:
        os.mkfifo(other, 0o600)
    os.rename(other, kit.logs_dir / name)  # another object under the spare's name
    assert kit.dispatcher.run_pass().activated is not None
    log = _log_of(kit, run_id)
    st = os.lstat(log)
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size == 0
    assert os.listdir(log.parent) == [log.name]  # no second name left in the shard
    assert outside.read_bytes() == b"not ours" and os.stat(outside).st_nlink == 1
    assert os.stat(outside).st_mtime == hour_ago
    assert _spare_names(kit.logs_dir) == []


def _dead_process() -> tuple[int, int]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        owner = _owner(child.pid)
    finally:
        child.kill()
        child.wait()
    return owner


def test_the_sweep_removes_only_dead_processes_spares(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    mine = LogSpares(root, _owner())
    assert mine.make()
    [own] = _spare_names(root)
    dead_pid, dead_ticks = _dead_process()
    parent_pid, parent_ticks = _owner(os.getppid())
    tail = "-0123456789ab"
    (root / f".spare-{dead_pid}-{dead_ticks}{tail}").write_bytes(b"")
    (root / f".spare-{parent_pid}-{parent_ticks}{tail}").write_bytes(b"")  # a live api's
    (root / f".spare-{parent_pid}-{parent_ticks + 1}{tail}").write_bytes(b"")  # pid reused
    (root / f".spare-{dead_pid}-{dead_ticks}").write_bytes(b"")  # not a spare's name
    os.mkdir(root / f".spare-{dead_pid}-{dead_ticks + 1}{tail}")
    outside = tmp_path / "outside"
    outside.write_bytes(b"kept")
    os.symlink(outside, root / f".spare-{dead_pid}-{dead_ticks + 2}{tail}")

    assert mine.sweep(runs) == 3
    assert _spare_names(root) == sorted(
        [
            own,
            f".spare-{parent_pid}-{parent_ticks}{tail}",
            f".spare-{dead_pid}-{dead_ticks}",
            f".spare-{dead_pid}-{dead_ticks + 1}{tail}",
        ]
    )
    assert outside.read_bytes() == b"kept"  # only the link's own name went


_KILLED_BETWEEN_LINK_AND_DROP = """
import os, signal, sys
from pathlib import Path
from app.execution import materializer
from app.worker.identity import read_identity, runs

root, shard, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
me = read_identity(os.getpid())
spares = materializer.LogSpares(root, (me.pid, me.start_ticks))
assert spares.make()
root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
os.mkdir(shard, 0o700, dir_fd=root_fd)
shard_fd = os.open(shard, os.O_RDONLY | os.O_DIRECTORY, dir_fd=root_fd)
os.unlink = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # the spare's name stays
spares.adopt(root_fd, shard_fd, name)
"""


def test_a_crash_between_link_and_dropping_the_spare_ends_in_one_start(
    engine: Engine, tmp_path: Path
) -> None:
    """Killed after the link: the log has two names and no T1. It is never taken for an
    orphan while the dead api's spare name holds it; the sweep drops that name, the orphan
    rule then reclaims the log, and the run starts exactly once."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    path = _log_of(kit, run.id)
    kit.logs_dir.mkdir(mode=0o700)
    repo = Path(__file__).resolve().parents[2]
    crashed = subprocess.run(
        [sys.executable, "-c", _KILLED_BETWEEN_LINK_AND_DROP, str(kit.logs_dir),
         path.parent.name, path.name],
        cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True,
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    [left] = _spare_names(kit.logs_dir)
    assert os.stat(path).st_nlink == 2 and os.path.samefile(path, kit.logs_dir / left)
    hour_ago = time.time() - 3600
    os.utime(path, (hour_ago, hour_ago))  # long past the orphan age

    first = kit.dispatcher.run_pass()
    assert [(o.kind, o.reason) for o in first.outcomes] == [("artifact_refused", "LOG_EXISTS")]
    assert LogSpares(kit.logs_dir, _owner()).sweep(runs) == 1
    assert _spare_names(kit.logs_dir) == [] and os.stat(path).st_nlink == 1
    second = kit.dispatcher.run_pass()
    assert [(o.kind, o.reason) for o in second.outcomes] == [
        ("artifact_refused", "LOG_ORPHAN_REMOVED")
    ]
    assert kit.dispatcher.run_pass().activated is not None
    assert kit.launcher.calls == 1
    events = [e.type for e in kit.events(run.id)]
    assert events.count("attempt.starting") == 1 and "attempt.failed" not in events


def test_prepare_log_shards_makes_every_shard_private(tmp_path: Path) -> None:
    root = tmp_path / "data" / "logs"
    assert prepare_log_shards(root) == 0
    assert sorted(os.listdir(root)) == sorted(SHARD_NAMES)
    for shard in SHARD_NAMES:
        st = os.lstat(root / shard)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert prepare_log_shards(root) == 0  # again: nothing to do, nothing refused


def test_prepare_log_shards_leaves_what_it_may_not_use(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir(mode=0o700)
    (root / "3f").write_bytes(b"not a directory")
    os.mkdir(root / "40")
    os.chmod(root / "40", 0o755)  # a mode not ours: a launch refuses it too
    assert prepare_log_shards(root) == 2
    assert (root / "3f").read_bytes() == b"not a directory"
    assert stat.S_IMODE(os.lstat(root / "40").st_mode) == 0o755
    assert len(os.listdir(root)) == len(SHARD_NAMES)


def test_prepare_log_shards_refuses_a_symlinked_root(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, tmp_path / "logs")
    assert prepare_log_shards(tmp_path / "logs") == len(SHARD_NAMES)
    assert os.listdir(elsewhere) == []
    spares = LogSpares(tmp_path / "logs", _owner())
    assert spares.make() is False and spares.take() is None
    assert os.listdir(elsewhere) == []


def test_no_room_for_files_no_spare_and_the_run_waits(engine: Engine, tmp_path: Path) -> None:
    """A file system out of inodes (a real tmpfs): shards and the spare are simply not made,
    the launch refuses its artifact as before and the run stays queued; once there is room
    again the next pass starts it."""
    define(engine)
    run = enqueue(engine)
    with mounted_tmpfs(tmp_path / "mnt", size_mib=1, inodes=300) as mnt:
        root = mnt / "logs"
        assert prepare_log_shards(root) == 0
        fillers = _fill_inodes(mnt)
        assert fillers  # every inode the shards left is taken now
        spares = LogSpares(root, _owner())
        assert spares.make() is False and spares.take() is None
        kit = make_kit(engine, root, spares=spares)
        result = kit.dispatcher.run_pass()
        assert [o.kind for o in result.outcomes] == ["artifact_refused"]
        assert kit.run(run.id).status == "queued" and kit.launcher.calls == 0
        for filler in fillers:
            filler.unlink()
        assert spares.make()
        assert kit.dispatcher.run_pass().activated is not None
        assert kit.launcher.calls == 1


def test_shards_cut_short_by_a_full_file_system_are_no_error(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "mnt", size_mib=1, inodes=64) as mnt:
        assert 0 < prepare_log_shards(mnt / "logs") < len(SHARD_NAMES)


def _fill_inodes(directory: Path) -> list[Path]:
    made = []
    while True:
        path = directory / f"filler-{len(made)}"
        try:
            path.write_bytes(b"")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            return made
        made.append(path)


def test_the_api_drain_makes_shards_and_a_spare_after_its_passes(
    engine: Engine, tmp_path: Path
) -> None:
    """Through the composition root: the first drain (here with no worker answering, so no
    run is touched) has every shard made, removes a dead api's spare and makes this
    process's own; later drains keep the one spare, and none is made once halted."""
    define(engine)
    enqueue(engine)
    settings = Settings.from_env({"QL_DATA_DIR": str(tmp_path / "data")})
    root = settings.logs_dir
    root.mkdir(mode=0o700, parents=True)
    dead_pid, dead_ticks = _dead_process()
    (root / f".spare-{dead_pid}-{dead_ticks}-0123456789ab").write_bytes(b"")
    hooks = build_execution(
        settings, candidates=RunReader(engine), definitions=DefinitionRepository(engine),
        secrets=MemorySecrets(), transitions=RunRepository(engine),
        client=CountingClient(tmp_path / "absent.sock"),
    )  # fmt: skip
    try:
        hooks.drain()
        [own] = _spare_names(root)
        assert own.startswith(f".spare-{os.getpid()}-{_owner()[1]}-")
        deadline = time.monotonic() + 10  # the shards are made on a thread of their own
        while not set(SHARD_NAMES) <= set(os.listdir(root)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(SHARD_NAMES) <= set(os.listdir(root))
        made = os.stat(root / own).st_ino
        hooks.drain()
        assert _spare_names(root) == [own] and os.stat(root / own).st_ino == made
        os.unlink(root / own)
        hooks.halt()
        hooks.drain()
        assert _spare_names(root) == []
    finally:
        hooks.close()
