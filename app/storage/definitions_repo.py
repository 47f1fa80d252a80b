"""Append-only task revisions and content-addressed recipes."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    bindparam,
    false,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError

from app.domain.canonical import canonical_json, content_digest, recipe_id
from app.domain.errors import Conflict, ErrorCode, NotFound, VersionConflict
from app.domain.execution import Leftovers
from app.domain.ids import now_ms
from app.domain.model import (
    ArchivedFilter,
    Page,
    Recipe,
    TaskRevision,
    TaskSummary,
    revision_body,
)
from app.domain.retry import RetryPolicy
from app.storage.cursor import decode_cursor, encode_cursor
from app.storage.tables import context_recipes, schedules, task_archive, task_revisions
from app.storage.uow import UnitOfWork


class DefinitionRepository:
    """Same content again is idempotent; different content for an existing key is a conflict."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # Revisions are immutable and never deleted (a PUT of other content is a conflict),
        # so one read is good for the process's life: the dispatcher reads the revision of
        # every run it starts (three statements on PostgreSQL). Bounded; dict ops are atomic.
        self._revisions: dict[tuple[str, int], TaskRevision] = {}

    def put_recipe(self, *, env: dict[str, str], secrets: dict[str, str]) -> tuple[Recipe, bool]:
        """Store a recipe by its content address; return ``(recipe, created)``."""
        rid = recipe_id(env, secrets)
        body = canonical_json({"env": env, "secrets": secrets}).decode("utf-8")
        try:
            with UnitOfWork(self._engine) as uow:
                existing = uow.conn.execute(
                    select(context_recipes).where(context_recipes.c.id == rid)
                ).first()
                if existing is not None:
                    return _check_same_recipe(existing, body), False
                at = now_ms()
                uow.conn.execute(
                    insert(context_recipes).values(id=rid, body=body, created_at_ms=at)
                )
                uow.commit()
                return Recipe(id=rid, env=dict(env), secrets=dict(secrets), created_at_ms=at), True
        except IntegrityError:
            return self.get_recipe(rid), False

    def get_recipe(self, rid: str) -> Recipe:
        """One recipe by id; NotFound otherwise."""
        with UnitOfWork(self._engine, write=False) as uow:
            row = uow.conn.execute(
                select(context_recipes).where(context_recipes.c.id == rid)
            ).first()
        if row is None:
            raise NotFound(ErrorCode.RECIPE_NOT_FOUND, "no such recipe")
        return _recipe(row)

    def put_revision(
        self,
        *,
        task: str,
        revision: int,
        executor: str,
        argv: list[str],
        cwd: str | None,
        recipe: str | None,
        timeout_seconds: int | None,
        priority: int,
        leftovers: Leftovers = "kill",
        run_as: str | None = None,
        max_concurrent: int | None = None,
        retry: RetryPolicy | None = None,
    ) -> tuple[TaskRevision, bool]:
        """Append a revision; ``(revision, created)``; Conflict when the content differs."""
        body = revision_body(
            executor=executor,
            argv=argv,
            cwd=cwd,
            recipe=recipe,
            timeout_seconds=timeout_seconds,
            priority=priority,
            leftovers=leftovers,
            run_as=run_as,
            max_concurrent=max_concurrent,
            retry=retry,
        )
        digest = content_digest(body)
        try:
            with UnitOfWork(self._engine) as uow:
                lock_task(uow.conn, task)
                existing = _select_revision(uow.conn, task, revision)
                if existing is not None:
                    return _check_same_revision(existing, digest), False
                if _archived_at(uow.conn, task) is not None:
                    raise Conflict(
                        ErrorCode.TASK_ARCHIVED,
                        f"task {task} is archived: unarchive it before adding a revision",
                    )
                if recipe is not None:
                    found = uow.conn.execute(
                        select(context_recipes.c.id).where(context_recipes.c.id == recipe)
                    ).first()
                    if found is None:
                        raise NotFound(ErrorCode.RECIPE_NOT_FOUND, "the recipe does not exist")
                at = now_ms()
                uow.conn.execute(
                    insert(task_revisions).values(
                        task=task,
                        revision=revision,
                        digest=digest,
                        executor=executor,
                        body=canonical_json(body).decode("utf-8"),
                        recipe_id=recipe,
                        timeout_seconds=timeout_seconds,
                        priority=priority,
                        created_at_ms=at,
                    )
                )
                uow.commit()
        except IntegrityError:
            # Lost a race with an identical or conflicting insert: decide from what won.
            return _check_same_revision(self._revision_row(task, revision), digest), False
        stored = TaskRevision(
            task=task,
            revision=revision,
            executor=executor,
            argv=tuple(argv),
            cwd=cwd,
            recipe=recipe,
            timeout_seconds=timeout_seconds,
            priority=priority,
            digest=digest,
            created_at_ms=at,
            leftovers=leftovers,
            run_as=run_as,
            max_concurrent=max_concurrent,
            retry=retry,
        )
        return stored, True

    def _revision_row(self, task: str, revision: int | None) -> Row[Any]:
        with UnitOfWork(self._engine, write=False) as uow:
            return revision_row(uow.conn, task, revision)

    def get_revision(self, task: str, revision: int) -> TaskRevision:
        """One revision; NotFound with TASK_NOT_FOUND or REVISION_NOT_FOUND."""
        key = (task, revision)
        found = self._revisions.get(key)
        if found is None:
            found = _revision(self._revision_row(task, revision))
            if len(self._revisions) >= _CACHED_REVISIONS:
                self._revisions.clear()
            self._revisions[key] = found
        return found

    def latest_revision(self, task: str) -> TaskRevision:
        """The highest revision of a task."""
        return _revision(self._revision_row(task, None))

    def list_revisions(self, task: str, *, limit: int, cursor: str | None) -> Page[TaskRevision]:
        """Revisions of a task, newest first."""
        query = select(task_revisions).where(task_revisions.c.task == task)
        if cursor is not None:
            (last,) = decode_cursor("revisions", cursor, (int,))
            query = query.where(task_revisions.c.revision < last)
        query = query.order_by(task_revisions.c.revision.desc()).limit(limit + 1)
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query).all()
            if not rows and cursor is None:
                raise NotFound(ErrorCode.TASK_NOT_FOUND, f"no task named {task}")
        items = [_revision(r) for r in rows[:limit]]
        nxt = encode_cursor("revisions", [items[-1].revision]) if len(rows) > limit else None
        return Page(items=items, next_cursor=nxt)

    def list_tasks(
        self, *, limit: int, cursor: str | None, archived: ArchivedFilter = "exclude"
    ) -> Page[TaskSummary]:
        """Tasks with their latest revision number, by name; archived ones only when asked."""
        archived_at = task_archive.c.archived_at_ms
        query = (
            select(
                task_revisions.c.task,
                func.max(task_revisions.c.revision).label("latest"),
                archived_at,
            )
            .select_from(
                task_revisions.outerjoin(
                    task_archive, task_archive.c.task == task_revisions.c.task
                )
            )
            .group_by(task_revisions.c.task, archived_at)
        )
        if archived == "exclude":
            query = query.where(archived_at.is_(None))
        elif archived == "only":
            query = query.where(archived_at.is_not(None))
        if cursor is not None:
            (last,) = decode_cursor("tasks", cursor, (str,))
            query = query.where(task_revisions.c.task > last)
        query = query.order_by(task_revisions.c.task).limit(limit + 1)
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query).all()
        items = [TaskSummary(r.task, int(r.latest), r.archived_at_ms) for r in rows[:limit]]
        nxt = encode_cursor("tasks", [items[-1].task]) if len(rows) > limit else None
        return Page(items=items, next_cursor=nxt)

    def get_task(self, task: str) -> tuple[TaskRevision, int | None]:
        """The latest revision of a task and when it was archived (None: it is not)."""
        row = self._revision_row(task, None)
        return _revision(row), row.task_archived_at_ms

    def set_archived(self, task: str, archived: bool) -> tuple[TaskRevision, int | None]:
        """Archive (or unarchive) a task; its latest revision and when it was archived (None:
        it is not). The same state again changes nothing. Refused
        (TASK_HAS_SCHEDULES) while a schedule that is not paused names the task: it would go
        on firing runs the archive refuses."""
        for _ in range(3):
            try:
                return self._set_archived_once(task, archived)
            except (IntegrityError, VersionConflict):
                continue  # another archive or unarchive of the task committed first
        raise VersionConflict("task archive")

    def _set_archived_once(self, task: str, archived: bool) -> tuple[TaskRevision, int | None]:
        at = now_ms()
        with UnitOfWork(self._engine) as uow:
            conn = uow.conn
            lock_task(conn, task)
            latest = revision_row(conn, task, None)  # TASK_NOT_FOUND
            row = conn.execute(
                select(task_archive).where(task_archive.c.task == task)
            ).first()
            current = None if row is None else row.archived_at_ms
            if (current is not None) == archived:
                return _revision(latest), current
            if archived:
                names = active_schedules_of(conn, task)
                if names:
                    shown = ", ".join(names[:_NAMED_SCHEDULES])
                    more = len(names) - _NAMED_SCHEDULES
                    shown += f" and {more} more" if more > 0 else ""
                    raise Conflict(
                        ErrorCode.TASK_HAS_SCHEDULES,
                        f"task {task} has schedules that are not paused ({shown}): pause or "
                        "delete them first",
                    )
            new_at = at if archived else None
            if row is None:
                conn.execute(
                    insert(task_archive).values(
                        task=task, archived_at_ms=new_at, version=1, updated_at_ms=at
                    )
                )
            else:
                done = conn.execute(
                    update(task_archive)
                    .where(task_archive.c.task == task, task_archive.c.version == row.version)
                    .values(archived_at_ms=new_at, version=row.version + 1, updated_at_ms=at)
                )
                if done.rowcount != 1:
                    raise VersionConflict("task archive")
            uow.commit()
            return _revision(latest), new_at


_CACHED_REVISIONS = 1024
_NAMED_SCHEDULES = 10  # a refused archive names at most this many schedules

# When the task of the row was archived (NULL: it is not), in the same statement as the
# revision: enqueue reads it with the revision it resolves, at no extra round trip.
_ARCHIVED_AT = (
    select(task_archive.c.archived_at_ms)
    .where(task_archive.c.task == task_revisions.c.task)
    .scalar_subquery()
    .label("task_archived_at_ms")
)
# Built once: enqueue resolves a revision inside the writer lock, and the dispatcher reads
# one for every run it starts (runs_repo explains).
_REVISION = select(task_revisions, _ARCHIVED_AT).where(
    task_revisions.c.task == bindparam("task"), task_revisions.c.revision == bindparam("revision")
)
_LATEST_REVISION = (
    select(task_revisions, _ARCHIVED_AT)
    .where(task_revisions.c.task == bindparam("task"))
    .order_by(task_revisions.c.revision.desc())
    .limit(1)
)
_ANY_REVISION = (
    select(task_revisions.c.revision).where(task_revisions.c.task == bindparam("task")).limit(1)
)
# The enqueue's reads on PostgreSQL: the task's advisory lock, shared, in the same statement
# as the revision (no round trip of its own). The statement's snapshot may be older than the
# lock (an archive that held it may have committed meanwhile): the enqueue's insert, a later
# statement, reads the archive again (runs_repo.enqueue_in).
_SHARED_TASK_LOCK = func.pg_advisory_xact_lock_shared(
    func.hashtextextended(bindparam("lock_key"), 0)
).label("task_lock")
_REVISION_SHARED = _REVISION.add_columns(_SHARED_TASK_LOCK)
_LATEST_REVISION_SHARED = _LATEST_REVISION.add_columns(_SHARED_TASK_LOCK)


_TASK_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:lock_key, 0))")
_TASK_LOCK_SHARED = select(_SHARED_TASK_LOCK)  # the enqueue's lock, on its own


def task_lock_key(task: str) -> str:
    """The name of a task's advisory lock on PostgreSQL (``lock_task``)."""
    return f"qinglong.task:{task}"


def lock_task(conn: Connection, task: str, *, shared: bool = False) -> None:
    """Make the writes that depend on a task's archive one step across api processes: on
    PostgreSQL a transaction-scoped advisory lock on the task's name, taken by an archive,
    an unarchive, a new revision and a schedule that may fire (so none of them decides on a
    state another is changing). An enqueue takes the same lock shared (``revision_row``
    with ``share_lock``), and a schedule's fire under a queue cap takes it shared before the
    queue's lock (``shared``). SQLite's write transactions are serial already."""
    if conn.dialect.name == "postgresql":
        conn.execute(_TASK_LOCK_SHARED if shared else _TASK_LOCK, {"lock_key": task_lock_key(task)})


def _archived_at(conn: Connection, task: str) -> int | None:
    return conn.execute(
        select(task_archive.c.archived_at_ms).where(task_archive.c.task == task)
    ).scalar_one_or_none()


def active_schedules_of(conn: Connection, task: str) -> list[str]:
    """Names of the schedules that are not paused and name ``task``, by name."""
    rows = conn.execute(
        select(schedules.c.name, schedules.c.body)
        .where(
            schedules.c.paused == false(),
            schedules.c.body.contains(f'"task":{json.dumps(task)}', autoescape=True),
        )
        .order_by(schedules.c.name)
    ).all()
    return [r.name for r in rows if json.loads(r.body).get("task") == task]


def refuse_archived(row: Row[Any], what: str) -> None:
    """Conflict TASK_ARCHIVED when the task of a row ``revision_row`` read is archived."""
    if row.task_archived_at_ms is not None:
        raise archived_conflict(row.task, what)


def archived_conflict(task: str, what: str) -> Conflict:
    """The Conflict TASK_ARCHIVED for ``task``: ``what`` says what the archive refuses."""
    return Conflict(ErrorCode.TASK_ARCHIVED, f"task {task} is archived: {what}; unarchive it first")


def _select_revision(conn: Connection, task: str, revision: int) -> Row[Any] | None:
    return conn.execute(_REVISION, {"task": task, "revision": revision}).first()


def revision_row(
    conn: Connection, task: str, revision: int | None, *, share_lock: bool = False
) -> Row[Any]:
    """The stored revision (the latest for None); NotFound TASK_NOT_FOUND/REVISION_NOT_FOUND.

    ``share_lock``: on PostgreSQL the same statement takes the task's lock shared, held to
    the commit (``lock_task``), once the task has a revision."""
    if share_lock and conn.dialect.name == "postgresql":
        params = {"task": task, "lock_key": task_lock_key(task)}
        if revision is None:
            row = conn.execute(_LATEST_REVISION_SHARED, params).first()
        else:
            row = conn.execute(_REVISION_SHARED, params | {"revision": revision}).first()
    elif revision is None:
        row = conn.execute(_LATEST_REVISION, {"task": task}).first()
    else:
        row = _select_revision(conn, task, revision)
    if row is not None:
        return row
    if revision is not None and conn.execute(_ANY_REVISION, {"task": task}).first():
        raise NotFound(ErrorCode.REVISION_NOT_FOUND, f"task {task} has no revision {revision}")
    raise NotFound(ErrorCode.TASK_NOT_FOUND, f"no task named {task}")


def _check_same_recipe(row: Row[Any], body: str) -> Recipe:
    if row.body != body:  # a digest collision, or a tampered row: never overwrite
        raise Conflict(ErrorCode.RECIPE_CONFLICT, "a different recipe has this id")
    return _recipe(row)


def _check_same_revision(row: Row[Any], digest: str) -> TaskRevision:
    if row.digest != digest:
        raise Conflict(
            ErrorCode.REVISION_CONFLICT,
            f"revision {row.revision} of task {row.task} exists with different content",
        )
    return _revision(row)


def _recipe(row: Row[Any]) -> Recipe:
    body = json.loads(row.body)
    return Recipe(
        id=row.id, env=body["env"], secrets=body["secrets"], created_at_ms=row.created_at_ms
    )


def _revision(row: Row[Any]) -> TaskRevision:
    body = json.loads(row.body)
    return TaskRevision(
        task=row.task,
        revision=row.revision,
        executor=body["executor"],
        argv=tuple(body["argv"]),
        cwd=body["cwd"],
        recipe=body["recipe"],
        timeout_seconds=body["timeout_seconds"],
        priority=body["priority"],
        digest=row.digest,
        created_at_ms=row.created_at_ms,
        leftovers=body.get("leftovers", "kill"),
        run_as=body.get("run_as"),
        max_concurrent=body.get("max_concurrent"),
        retry=retry_of_body(body),
    )


def retry_of_body(body: dict[str, Any]) -> RetryPolicy | None:
    """The retry policy a stored revision body carries, if any."""
    retry = body.get("retry")
    return RetryPolicy.from_body(retry) if isinstance(retry, dict) else None
