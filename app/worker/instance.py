"""Who this worker is, for the worker lease (docs/worker-lease.md).

The instance id names a data dir: it is created once, kept in ``<data dir>/instance-id``
(0600) and read by every later start, so a worker restarted on the same data dir (by its
supervisor, or after a kill -9) is recognised as the same instance. The file is published
the way receipts are (temp file, fsync, ``link()`` that refuses to replace), so two
starting workers never end up with two ids and a crash never leaves half of one.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from app.domain.ids import is_uuid7, uuid7
from app.domain.lease import Claimant, Lease
from app.storage.durable import fsync_dir, sweep_temps
from app.worker.identity import current_boot_id, read_identity

INSTANCE_FILE = "instance-id"
_MAX_BYTES = 64


_TEMP_BYTES = 8  # of a temp file's random name part (``sweep_instance_temps``)


def sweep_instance_temps(data_dir: Path) -> int:
    """Remove the temp files a publish of the instance id killed before its ``unlink``
    left (``sweep_temps``). Run at each start."""
    return sweep_temps(data_dir / INSTANCE_FILE, 2 * _TEMP_BYTES)


def instance_id(data_dir: Path) -> str:
    """This data dir's instance id, created on first use.

    Raises: ValueError (the file exists but does not hold an id: never silently replaced,
    since a new id would make this worker a stranger to its own lease).
    """
    path = data_dir / INSTANCE_FILE
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    _publish(path, uuid7())
    return _read(path)  # ours, or the one a concurrent first start published


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        text = os.read(fd, _MAX_BYTES + 1).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not is_uuid7(text):
        raise ValueError(f"{path} does not hold an instance id; restore it or remove it")
    return text


def _publish(path: Path, value: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.urandom(_TEMP_BYTES).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, f"{value}\n".encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # a concurrent first start won
            os.link(tmp, path, follow_symlinks=False)
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)


def claimant(data_dir: Path) -> Claimant:
    """This process as a lease claimant: instance, host name, boot id, pid and start time."""
    me = read_identity(os.getpid())
    assert me is not None  # this process is alive
    return Claimant(
        instance_id=instance_id(data_dir),
        host=socket.gethostname(),
        boot_id=current_boot_id(),
        pid=me.pid,
        start_ticks=me.start_ticks,
    )


def holder_alive(lease: Lease) -> bool:
    """The lease holder's exact process (boot, pid, start time) still runs here."""
    if lease.boot_id != current_boot_id():
        return False
    found = read_identity(lease.pid)
    return found is not None and found.start_ticks == lease.start_ticks
