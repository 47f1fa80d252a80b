"""Unit of work over one Connection: ``with uow: ...; uow.commit()``, rolled back otherwise.

Every repository transaction goes through here, so this is the one place where a database
that cannot take writes (disk full, read-only; app.storage.unavailable) becomes
StorageUnavailable, which the api answers with 503 (app/api/problems.py).

On SQLite, write units of work of one process take turns on an in-process gate, and the ones
that meet there share one transaction and one commit (group commit, docs/design.md §5.3),
synced unless every member said ``synced=False`` (T1): each runs inside its own SAVEPOINT of
the open transaction, so its rollback undoes its writes alone, and its ``commit()`` returns
only once the whole group is committed. No caller acts on its write before that (T1's acts
only through a later synced commit), so a crash before the commit loses the whole group
exactly as it would have lost each of them alone.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from app.domain.errors import StorageUnavailable
from app.storage.engine import WRITE
from app.storage.unavailable import WRITE_HEALTH, is_storage_unavailable

# How many units of work one SQLite transaction carries at most: the writer lock is held
# across the whole group, and the other process's writers wait for it meanwhile.
MAX_GROUP = 16
_MEMBER = "ql_member"  # the savepoint of the member running now (one at a time)


class GroupCommitFailed(Exception):
    """The shared commit of a group failed for a reason other than storage: nothing of this
    unit of work was committed (the driver's error is the ``__cause__``)."""


class _Group:
    """One open SQLite write transaction and the members it carries."""

    __slots__ = ("conn", "done", "error", "joined", "members", "synced")

    def __init__(self, conn: Connection, *, synced: bool) -> None:
        self.conn = conn
        self.synced = synced  # its first member's; only unsynced members make it False
        self.joined = 0  # members that ran in it, committed or not (the bound counts these)
        self.members = 0  # released savepoints that wait for the commit
        self.done = threading.Event()
        self.error: BaseException | None = None


class _Gate:
    """SQLite has one writer at a time, and a writer that finds the lock taken sleeps in
    SQLite's busy handler (1, 2, 5, 10... ms) instead of waking when it is free. Threads of
    one process therefore queue for it here, on a lock that hands over at once; other
    processes still meet the busy timeout. Profiled in bench/profile_dispatch.py (BEGIN
    IMMEDIATE waits)."""

    __slots__ = ("counter", "group", "holder", "lock", "others", "waiting")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counter = threading.Lock()
        self.waiting = 0  # grouped units of work waiting for ``lock``
        self.others = 0  # ungrouped ones waiting for it
        self.group: _Group | None = None
        self.holder: int | None = None  # the thread running a member now


_GATES: weakref.WeakKeyDictionary[Engine, _Gate] = weakref.WeakKeyDictionary()
_GATES_LOCK = threading.Lock()


def _writer_gate(engine: Engine) -> _Gate | None:
    """The in-process writer gate of a SQLite engine; None for PostgreSQL (row locks)."""
    if engine.dialect.name != "sqlite":
        return None
    with _GATES_LOCK:
        gate = _GATES.get(engine)
        if gate is None:
            gate = _GATES[engine] = _Gate()
        return gate


def _another_may_join(gate: _Gate, group: _Group) -> bool:
    """A grouped unit of work waits for the gate, no ungrouped one does (it may be long and
    would hold the group's members back), and the group has room."""
    return gate.waiting > 0 and gate.others == 0 and group.joined < MAX_GROUP


def _transaction_open(group: _Group) -> bool:
    """False once SQLite ended the group's transaction itself (a full disk, an I/O error),
    or the connection can no longer say (it was invalidated)."""
    try:
        raw = group.conn.connection.dbapi_connection
        return raw is not None and bool(raw.in_transaction)
    except Exception:
        return False


def _sqlite_synchronous(conn: Connection, level: str) -> None:
    """Set the connection's ``PRAGMA synchronous`` (only outside a transaction)."""
    raw = conn.connection.dbapi_connection
    assert raw is not None
    raw.execute(f"PRAGMA synchronous={level}")


def _restore_synchronous(conn: Connection) -> None:
    """Back to FULL (app/storage/engine.py) before the connection returns to the pool; one
    that cannot say it is FULL again is dropped instead."""
    try:
        _sqlite_synchronous(conn, "FULL")
    except Exception:
        conn.invalidate()


class UnitOfWork:
    """One transaction. Leaving the block without ``commit()`` rolls it back.

    ``grouped`` (SQLite writes only): when another grouped unit of work waits at the gate as
    this one commits, leave the transaction open for it and wait for the group's commit
    instead of committing alone. For the short transactions on a run's path; a long one
    (retention, migrations) stays ungrouped, and a group is committed at once while one
    waits, so it does not hold finished members back. Any write may still find a group open
    when it gets the gate; it then joins, and commits the group when it ends.

    ``synced=False`` (SQLite; PostgreSQL ignores it): the commit need not be synced before
    ``commit()`` returns, because nothing outside the database acts on this write before a
    later synced commit of the same database, which makes it durable too (the WAL is one
    file, synced whole). Its group commits under ``PRAGMA synchronous=NORMAL``, and the
    connection is back to FULL before it returns to the pool. Only T1 (docs/design.md §5.3:
    the worker's journal reserve, synced, comes before its job). A synced unit of work that
    finds an unsynced group open commits that group first; the other way round it joins.
    A caller on PostgreSQL says so inside its transaction (``set_config`` of
    ``synchronous_commit``, as T1's lock statement does).

    ``one_statement`` (PostgreSQL only; SQLite ignores it): the block runs exactly one
    statement, which is then its own transaction, without psycopg's separate BEGIN and the
    COMMIT. Only for a unit of work whose whole effect is that statement: a second one would
    commit on its own.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        write: bool = True,
        grouped: bool = False,
        one_statement: bool = False,
        synced: bool = True,
    ) -> None:
        self._synced = synced
        self._engine = engine
        self._write = write
        self._conn: Connection | None = None
        self._committed = False
        self._gate = _writer_gate(engine) if write else None
        self._grouped = grouped and self._gate is not None
        self._group: _Group | None = None
        self._savepoint = False
        # A read that ended without error commits on PostgreSQL: psycopg drops every
        # prepared statement of the connection on ROLLBACK (and sends DEALLOCATE ALL), so
        # rolled-back reads kept the hot statements from ever being prepared: each was
        # parsed and planned again (~0.7 ms for the dispatch page). A read-only
        # transaction's COMMIT writes nothing.
        self._end_read_by_commit = not write and engine.dialect.name == "postgresql"
        # One statement is its own transaction on PostgreSQL: run in the driver's autocommit,
        # it is atomic and, with synchronous_commit on, durable once the driver returns its
        # result (the server commits before it answers ReadyForQuery, which the driver waits
        # for). psycopg's BEGIN and the COMMIT are then two round trips fewer.
        self._autocommit = one_statement and engine.dialect.name == "postgresql"

    @property
    def conn(self) -> Connection:
        """The connection of the open transaction."""
        if self._conn is None:
            raise RuntimeError("unit of work is not open")
        return self._conn

    def __enter__(self) -> UnitOfWork:
        if self._gate is not None:
            return self._join(self._gate)
        try:
            conn = self._open()
        except BaseException as exc:
            self._refused(exc)
            raise
        self._conn = conn
        self._committed = False
        return self

    def _open(self) -> Connection:
        """A connection with its transaction begun (BEGIN IMMEDIATE for a SQLite write,
        app/storage/engine.py)."""
        conn = self._engine.connect()
        if self._write:
            conn = conn.execution_options(**{WRITE: True})
        if self._autocommit:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        try:
            if not self._synced and self._gate is not None:
                _sqlite_synchronous(conn, "NORMAL")
            conn.begin()
        except BaseException:
            if not self._synced and self._gate is not None:
                _restore_synchronous(conn)
            conn.close()
            raise
        return conn

    def commit(self) -> None:
        """Commit the transaction; the block may not write afterwards.

        In a group, this returns once the group's commit did; it raises StorageUnavailable
        (or GroupCommitFailed) when that commit failed, and nothing of this unit was kept.
        """
        if self._group is not None:
            self._commit_member(self._group)
            return
        self.conn.commit()
        self._committed = True
        if self._write:
            WRITE_HEALTH.committed(self._engine)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._group is not None:
            self._leave_member(self._group, exc)
            return
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if not self._committed:
                if exc is None and self._end_read_by_commit:
                    conn.commit()
                else:
                    conn.rollback()
        finally:
            conn.close()
        if exc is not None:
            self._refused(exc)

    def _refused(self, exc: BaseException) -> None:
        if is_storage_unavailable(exc):
            WRITE_HEALTH.refused(self._engine)
            raise StorageUnavailable() from exc

    # -- SQLite: the gate and its group ------------------------------------------------------

    def _join(self, gate: _Gate) -> UnitOfWork:
        if gate.holder == threading.get_ident():
            # It would wait for its own group's commit: a write inside a write is a bug.
            raise RuntimeError("a write unit of work opened inside another on one thread")
        with gate.counter:
            if self._grouped:
                gate.waiting += 1
            else:
                gate.others += 1
        try:
            gate.lock.acquire()
        finally:
            with gate.counter:
                if self._grouped:
                    gate.waiting -= 1
                else:
                    gate.others -= 1
        group = gate.group
        if group is not None and self._synced and not group.synced:
            # A group's commit is synced or not as a whole, from its first member on (SQLite
            # takes no change of it inside a transaction): the unsynced one commits first.
            # An unsynced unit of work joins a synced group: the sync does it no harm.
            try:
                self._close_group(gate, group)
            except BaseException:
                gate.lock.release()
                raise
            self._health(group)
            group = None
        if group is None:
            try:
                conn = self._open()
            except BaseException as exc:
                gate.lock.release()
                self._refused(exc)
                raise
            group = gate.group = _Group(conn, synced=self._synced)
        gate.holder = threading.get_ident()
        group.joined += 1
        # The first member is the transaction alone: its rollback is the transaction's. A
        # later one sees the uncommitted writes of those before it.
        self._savepoint = group.members > 0
        if self._savepoint:
            try:
                group.conn.exec_driver_sql(f"SAVEPOINT {_MEMBER}")
            except BaseException as exc:
                self._end_group(gate, group, broken=exc)
                self._refused(exc)
                raise
        self._group, self._conn = group, group.conn
        self._committed = False
        return self

    def _commit_member(self, group: _Group) -> None:
        gate = self._gate
        assert gate is not None
        self._group, self._conn = None, None  # the connection is the group's from here on
        try:
            if not _transaction_open(group):
                # SQLite ended the transaction under this member (a caller went on after a
                # full disk): its writes, and those before it, are gone.
                raise RuntimeError("the group's transaction ended before its commit")
            if self._savepoint:
                group.conn.exec_driver_sql(f"RELEASE {_MEMBER}")
        except BaseException as exc:  # the members before it lose their writes too
            self._end_group(gate, group, broken=exc)
            self._refused(exc)
            raise
        group.members += 1
        self._committed = True
        self._hand_on(gate, group, may_stay_open=self._grouped)
        if group.error is not None:
            self._committed = False
            self._raise_group_error(group.error)
        WRITE_HEALTH.committed(self._engine)

    def _leave_member(self, group: _Group, exc: BaseException | None) -> None:
        """Leave without committing: undo this member's writes. One that ran after others
        (a savepoint) may have decided on their uncommitted writes (a replayed key, an
        ending already recorded), so it returns only once the group's commit did, and
        raises when that commit failed."""
        gate = self._gate
        assert gate is not None
        self._group, self._conn = None, None
        broken: BaseException | None = None
        if self._savepoint and not _transaction_open(group):
            broken = exc or RuntimeError("the group's transaction ended")
        elif self._savepoint:
            try:
                group.conn.exec_driver_sql(f"ROLLBACK TO {_MEMBER}")
                group.conn.exec_driver_sql(f"RELEASE {_MEMBER}")
            except BaseException as rollback_exc:
                broken = rollback_exc
        if broken is not None:
            # The members before it lost their writes too: end the group with the error.
            self._end_group(gate, group, broken=broken)
        else:
            # The first member is the transaction alone: ending the group rolls it back. An
            # ungrouped one ends the group rather than wait for a writer after it.
            self._hand_on(gate, group, may_stay_open=self._savepoint and self._grouped)
        if exc is not None:
            self._refused(exc)
        elif self._savepoint and group.error is not None:
            self._raise_group_error(group.error)

    def _hand_on(self, gate: _Gate, group: _Group, *, may_stay_open: bool) -> None:
        """Leave the group open for a waiting member and wait for its commit, or end it."""
        if may_stay_open and group.members > 0 and _another_may_join(gate, group):
            gate.holder = None
            gate.lock.release()  # a waiting unit joins; the last one commits for all
            group.done.wait()
        else:
            self._end_group(gate, group)

    def _end_group(
        self, gate: _Gate, group: _Group, *, broken: BaseException | None = None
    ) -> None:
        """Commit the group (roll it back when ``broken`` or nobody is in it), wake its
        members and hand the gate on. Called with the gate held."""
        try:
            self._close_group(gate, group, broken=broken)
        finally:
            gate.lock.release()
        self._health(group)

    def _health(self, group: _Group) -> None:
        if group.error is not None and is_storage_unavailable(group.error):
            WRITE_HEALTH.refused(self._engine)

    def _close_group(
        self, gate: _Gate, group: _Group, *, broken: BaseException | None = None
    ) -> None:
        """Commit the group (roll it back when ``broken`` or nobody is in it) and wake its
        members; the gate stays held."""
        try:
            if broken is not None:
                group.error = broken
                group.conn.rollback()
            elif group.members == 0:
                group.conn.rollback()
            else:
                group.conn.commit()
        except BaseException as exc:
            group.error = group.error or exc
            with contextlib.suppress(Exception):  # closing below discards it anyway
                group.conn.rollback()
        finally:
            try:
                if not group.synced:
                    _restore_synchronous(group.conn)
                group.conn.close()
            finally:
                gate.group = None
                gate.holder = None
                group.done.set()

    def _raise_group_error(self, error: BaseException) -> None:
        if is_storage_unavailable(error):
            raise StorageUnavailable() from error
        if isinstance(error, StorageUnavailable):  # the engine's (DatabaseBusy): each its own
            raise type(error)() from error
        raise GroupCommitFailed("the shared commit failed; nothing of it was kept") from error


T = TypeVar("T")


def retried_on_duplicate(write: Callable[[], T], *, tries: int) -> T:
    """``write()`` (its own UnitOfWork), again while it meets a duplicate key, ``tries`` in
    all; the last one's error goes on. PostgreSQL: an UPDATE-or-INSERT of a new key locks no
    row, so a concurrent writer of the same key may insert first and this insert fail; that
    row is committed then, and the next try's UPDATE meets it. Each failed try is another
    writer's commit: a bound on progress, not a spin. (SQLite's BEGIN IMMEDIATE serializes
    the writes: never there.) Only for tables whose one unique key is the one raced for."""
    for _ in range(tries - 1):
        try:
            return write()
        except IntegrityError:
            pass
    return write()

