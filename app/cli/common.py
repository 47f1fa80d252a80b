"""What every ``qinglong`` sub-command shares: its settings, and one engine lifecycle.

The ``qinglong`` parser imports every sub-command module, so a module imports at its top only
what registering its sub-commands needs and what every service command loads anyway
(SQLAlchemy, the engine, the domain: ``_service_main`` maps their errors); a handler imports
the rest when it runs (tables and repositories, uvicorn, alembic, the supervisor).
``qinglong worker`` then does not load the api's web stack, nor ``qinglong serve`` (the
supervisor) either (tests/cli/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import pwd
import resource
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from app.domain.errors import NotMigrated, StorageUnavailable
from app.settings import SERVICE_START_ENV, Settings
from app.storage.durable import CannotMake, read_only_error
from app.storage.engine import make_engine
from app.storage.private_files import require_own_socket_dir, require_private


class NoDatabase(Exception):
    """A command that reads the service's SQLite database found no file where it looked:
    most often run from another directory than the service's (the default data dir,
    ``./.qinglong``, is relative). One line naming the path, exit 1; never ``migrate``'s
    advice, which would make a second, empty database there."""


class NotTheOwner(ValueError):
    """root ran a service command on a data dir another user owns: every file it made there
    (a rotated key file, SQLite's -wal and -shm, a log shard) would be root's, and the
    service, running as that user, could not read it. One line naming the user; exit 2."""


def settings_for(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with ``--data-dir`` applied; NotTheOwner for root on
    another user's data dir."""
    settings = Settings.from_env(data_dir=getattr(args, "data_dir", None))
    _refuse_root_on_another_users_dir(settings.data_dir)
    return settings


def _refuse_root_on_another_users_dir(data_dir: Path) -> None:
    if os.geteuid() != 0:
        return  # another user cannot write there anyway: the OS refuses, with its own words
    try:
        owner = data_dir.stat().st_uid
    except OSError:
        return  # not there yet: whoever makes it owns it
    if owner == 0:
        return
    try:
        name = pwd.getpwuid(owner).pw_name
    except KeyError:
        name = str(owner)
    raise NotTheOwner(
        f"the data dir {data_dir} belongs to {name} (uid {owner}) and this runs as root: "
        f"files made now would be root's, unreadable to the service; run it as {name} "
        f"(sudo -u {name} qinglong ...; deploy/README.md uses systemd-run --uid={name})"
    )


def private_settings(args: argparse.Namespace, *, binds_socket: bool = False) -> Settings:
    """``settings_for``, once the data dir exists and every file of it is private to us.

    The start-up check of ``serve``, ``api``, ``worker`` and ``migrate``: raises NotPrivate
    (a ValueError: one line naming the ``chmod`` that fixes it) before anything is opened;
    CannotMake when the data dir is missing and cannot be made, or (``binds_socket``) the
    socket's directory is on a read-only mount.
    ``binds_socket`` (``serve``, ``worker``): the worker socket's directory too.
    """
    settings = settings_for(args)
    try:
        settings.ensure_data_dir()
    except OSError as exc:  # a full or read-only disk: one line, not a traceback
        raise CannotMake(settings.data_dir, exc, where=str(settings.data_dir.parent)) from None
    require_private(
        data_dir=settings.data_dir, database_url=settings.database_url, key_file=settings.key_file
    )
    if binds_socket:
        socket_dir = settings.socket_path.parent
        read_only = read_only_error(socket_dir)
        if read_only is not None:  # before the check below, which would advise a chown
            where = "the data dir" if socket_dir == settings.data_dir else str(socket_dir)
            raise CannotMake(settings.socket_path, read_only, where=where)
        require_own_socket_dir(settings.socket_path)
    return settings


class _RefusalLines:
    """Where the one line of a role that cannot go on is written (``refuse``).

    By default ``qinglong: <line>`` on stderr, as every command says it. A role started by
    ``qinglong serve`` that set up its log lines (``log_lines``: the worker) writes it as one
    of them, with the time and the role: it sits among the other roles' lines, and a worker
    refused again and again during an outage says when each time (docs/operations.md §5).
    """

    def __init__(self) -> None:
        self._log: logging.Logger | None = None

    def log_lines(self, role: str) -> None:
        """This process's log lines (time, role, level, message) on stderr; under ``qinglong
        serve`` its refusal among them."""
        logging.basicConfig(
            level=logging.INFO, format=f"%(asctime)s {role} %(levelname)s %(message)s"
        )
        if SERVICE_START_ENV in os.environ:
            self._log = logging.getLogger(f"qinglong.{role}")

    def refuse(self, line: str) -> None:
        """Say why this process stops (one line, no traceback)."""
        if self._log is None:
            print(f"qinglong: {line}", file=sys.stderr)
        else:
            self._log.error("%s", line)


REFUSAL = _RefusalLines()


# Held for a lifetime by ``qinglong serve`` (SERVE_LOCK) and by ``qinglong api`` (API_LOCK,
# whose uvicorn workers keep their metric files in ``<data dir>/metrics``); the next one on
# the same data dir refuses before it touches anything (docs/operations.md §3).
SERVE_LOCK = "serve.lock"
API_LOCK = "api.lock"
EXIT_DATA_DIR_IN_USE = 75  # as a worker refused its lease: restarting cannot help


def hold_lock(path: Path) -> int | None:
    """An exclusive lock on ``path`` (a private file, made if missing), held until the
    returned descriptor closes (with this process); None when another process holds it.

    Raises: ValueError (the file cannot be made or opened: one line, exit 2).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ValueError(f"cannot open {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:
        # A file system without locks (NFS without lockd: ENOLCK): the service ran there
        # before the lock existed, so it still does, unguarded against a second service.
        print(
            f"qinglong: cannot lock {path} ({exc.strerror}): a second service on this data "
            "dir would not be refused",
            file=sys.stderr,
        )
    return fd


def _require_sqlite_file(settings: Settings) -> None:
    """NoDatabase when the settings name a SQLite file that is not there."""
    url = make_url(settings.database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    path = Path(url.database)
    if path.exists():
        return
    if settings.database_in_data_dir:
        where = (
            "give the service's data dir with --data-dir or QL_DATA_DIR (the default, "
            "./.qinglong, is relative to the current directory)"
        )
    else:
        where = "check QL_DATABASE_URL"
    raise NoDatabase(f"no database at {path}; {where}")


class KeyFileMissing(Exception):
    """No key file and no ``QL_SECRET_KEY`` while the database holds secrets, or cannot say
    whether it does: one line saying where the key must come from, exit 1."""


T = TypeVar("T")


class ApiCannotStart(Exception):
    """A step of ``qinglong api`` or ``serve`` before uvicorn starts (``start_step``) raised
    what no refusal covers: a broken install (a database driver that does not import). One
    line, ``the api cannot start: <reason>`` (app/api/start_failure.py's ``reason``: the type, an
    import or OS error's words, where), and exit 3, as when the api's workers cannot start."""


def refusals() -> tuple[type[Exception], ...]:
    """The exceptions a service command already says as one line (``_service_main``)."""
    from app.domain.errors import DomainError, KeyUnavailable

    return (NoDatabase, KeyFileMissing, CannotMake, DomainError, KeyUnavailable,
            StorageUnavailable, SQLAlchemyError, ValueError)  # fmt: skip


def start_step(step: Callable[[], T]) -> T:
    """``step()``, one of ``qinglong api``'s (or ``serve``'s) before uvicorn: what it raises
    that a refusal covers goes on as it is; anything else is ``ApiCannotStart``, never a
    traceback (the key check builds an engine here, importing the driver)."""
    try:
        return step()
    except refusals():
        raise
    except Exception as exc:
        from app.api.start_failure import cannot_start

        raise ApiCannotStart(cannot_start(exc)) from None


def make_first_start_files(settings: Settings, *, key: bool = True) -> str | None:
    """Make (or read) the key file (given ``key``, unless ``QL_SECRET_KEY`` is set) and the
    data dir's instance id, as each api process (the worker: the id only) would at its start;
    why they cannot be made (None: they are there). ``qinglong api`` and ``qinglong worker``
    ask before they start anything, so a first start on a full disk is one line rather than
    a traceback (in every uvicorn worker). Both files are linked into place whole, so a
    refusal leaves neither (docs/disk-full-and-readiness.md)."""
    from app.storage.secret_crypto import KeyRing, sweep_key_temps
    from app.worker.instance import INSTANCE_FILE, instance_id, sweep_instance_temps

    # What a start killed between writing a temp file and removing it left behind.
    if key:
        sweep_key_temps(settings.key_file)
    sweep_instance_temps(settings.data_dir)
    made = settings.key_file
    try:
        if key and not settings.secret_key:
            KeyRing.from_settings(secret_key=None, key_file=made)
        made = settings.data_dir / INSTANCE_FILE
        instance_id(settings.data_dir)
    except OSError as exc:
        return str(CannotMake(made, exc))  # a loop, a read-only mount, a mode: said as is
    return None


def require_key_for_stored_secrets(settings: Settings) -> None:
    """KeyFileMissing when there is no key file (and ``QL_SECRET_KEY`` is unset) while the
    database already holds secrets: the key file made on first use would decrypt none of
    them, and each secret set under it would be lost once the right key file is put back
    (a data dir restored without its ``secret.key``, docs/operations.md §3; a new host of a
    shared PostgreSQL, docs/several-hosts.md). Checked by ``serve``, ``api`` and ``secrets
    rotate-key`` before anything makes the key file; the database is read only when the
    file is missing. A database not made or not migrated yet holds no secret; one that does
    not answer cannot say, so nothing is made until it does (the api's unit restarts it)."""
    if settings.secret_key or settings.key_file.exists():
        return
    from app.storage.secrets_repo import stored_key_ids

    try:
        _require_sqlite_file(settings)
    except NoDatabase:
        return
    where = (
        f"no key file at {settings.key_file} and QL_SECRET_KEY is unset, but the database "
    )
    engine = make_engine(settings.database_url)
    try:
        key_ids = stored_key_ids(engine)
    except NotMigrated:
        return  # no secrets table yet (a statement against a missing table: NotMigrated)
    except (StorageUnavailable, SQLAlchemyError) as exc:
        from app.storage.unavailable import connect_failure_reason

        # The driver's words tell a server that is down from a refused login or a bad file.
        reason = connect_failure_reason(exc) or type(exc).__name__
        raise KeyFileMissing(
            f"{where}could not be read ({reason}), so whether it holds secrets is unknown "
            "and no key file is made: start again once it can be read"
        ) from None
    finally:
        engine.dispose()
    if key_ids:
        raise KeyFileMissing(
            f"{where}holds secrets under key(s) {' '.join(key_ids)}, which a new key file "
            "would not decrypt, so none is made: restore the secret.key that wrote them (a "
            "backup keeps it apart, docs/operations.md §3), copy it from a host that shares "
            "this database, or set the same QL_SECRET_KEY on every host "
            "(docs/several-hosts.md)"
        )


@contextmanager
def database(
    args: argparse.Namespace, *, private: bool = False
) -> Iterator[tuple[Settings, Engine]]:
    """The command's settings and an engine on its database, disposed of on the way out.

    ``private`` applies ``private_settings``'s start-up check first (the commands that may
    create files in the data dir).
    """
    settings = private_settings(args) if private else settings_for(args)
    if not private:
        _require_sqlite_file(settings)
    engine = make_engine(settings.database_url)
    try:
        yield settings, engine
    finally:
        engine.dispose()


def fd_room(wanted: int) -> bool:
    """Raise this process's soft open-file limit to ``wanted`` (up to the hard one); whether
    ``wanted`` fits now.

    Past the soft limit a descriptor cannot be opened (EMFILE): for the api an accept()
    that fails and stops accepting for a second, for the worker the pidfd of one more
    running shim. The soft limit is raised only when short: children (the worker's zygote
    and shims, so the jobs) inherit it, and a program that closes every descriptor up to
    its limit is slow under a large one (systemd's reason to keep 1024 soft).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return True
    room = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
    return room >= wanted
