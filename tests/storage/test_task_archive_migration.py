"""Migration 0015, archived tasks, down and up again on a database with an archived task,
on both engines (docs/operations.md §4)."""

from __future__ import annotations

from alembic import command
from sqlalchemy import Engine, inspect

from app.storage.definitions_repo import DefinitionRepository
from app.storage.migrate import upgrade_to_head
from tests.storage.helpers import define_task
from tests.storage.test_upgrade_from_0004 import empty_engine, migrate_to

__all__ = ["empty_engine"]  # the fixture, on a fresh SQLite file or a private PG schema


def test_a_downgrade_below_0015_lists_an_archived_task_again_and_the_upgrade_archives_anew(
    empty_engine: Engine,
) -> None:
    engine = empty_engine
    upgrade_to_head(engine)
    task = "job"
    define_task(engine, task)
    repo = DefinitionRepository(engine)
    assert repo.set_archived(task, True)[1] is not None
    assert repo.list_tasks(limit=5, cursor=None).items == []
    migrate_to(engine, "0014", command.downgrade)
    assert "task_archive" not in inspect(engine).get_table_names()
    upgrade_to_head(engine)
    assert [t.task for t in repo.list_tasks(limit=5, cursor=None).items] == [task]
    assert repo.set_archived(task, True)[1] is not None
    assert repo.list_tasks(limit=5, cursor=None, archived="only").items[0].task == task
