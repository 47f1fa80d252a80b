"""Append-only revisions and content-addressed recipes: idempotent, or a conflict."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine

from app.domain.errors import Conflict, ErrorCode, NotFound
from app.domain.model import TaskSummary
from app.storage.definitions_repo import DefinitionRepository


def _put(repo: DefinitionRepository, revision: int = 1, **overrides: object) -> tuple[object, bool]:
    fields: dict[str, object] = {
        "task": "job", "revision": revision, "executor": "local_process",
        "argv": ["/bin/echo", "hi"], "cwd": None, "recipe": None,
        "timeout_seconds": 60, "priority": 0,
    }  # fmt: skip
    fields.update(overrides)
    return repo.put_revision(**fields)  # type: ignore[arg-type]


def test_same_recipe_twice_is_idempotent_and_keyed_by_content(engine: Engine) -> None:
    repo = DefinitionRepository(engine)
    first, created = repo.put_recipe(env={"B": "2", "A": "1"}, secrets={"TOKEN": "api"})
    again, created_again = repo.put_recipe(env={"A": "1", "B": "2"}, secrets={"TOKEN": "api"})
    assert created and not created_again
    assert first.id == again.id and first.created_at_ms == again.created_at_ms
    other, _ = repo.put_recipe(env={"A": "1"}, secrets={})
    assert other.id != first.id
    assert repo.get_recipe(first.id).env == {"A": "1", "B": "2"}
    with pytest.raises(NotFound):
        repo.get_recipe("localctx:sha256:" + "0" * 64)


def test_same_revision_twice_is_idempotent_and_different_content_conflicts(engine: Engine) -> None:
    repo = DefinitionRepository(engine)
    first, created = _put(repo)
    again, created_again = _put(repo)
    assert created and not created_again and first == again
    with pytest.raises(Conflict) as info:
        _put(repo, argv=["/bin/echo", "changed"])
    assert info.value.code == ErrorCode.REVISION_CONFLICT
    assert repo.get_revision("job", 1).argv == ("/bin/echo", "hi")


def test_revision_must_name_an_existing_recipe(engine: Engine) -> None:
    repo = DefinitionRepository(engine)
    with pytest.raises(NotFound) as info:
        _put(repo, recipe="localctx:sha256:" + "1" * 64)
    assert info.value.code == ErrorCode.RECIPE_NOT_FOUND
    recipe, _ = repo.put_recipe(env={}, secrets={})
    rev, created = _put(repo, recipe=recipe.id)
    assert created and rev.recipe == recipe.id  # type: ignore[attr-defined]


def test_concurrent_identical_and_conflicting_writes_keep_one_revision(engine: Engine) -> None:
    repo = DefinitionRepository(engine)
    barrier = threading.Barrier(6)
    outcomes: list[str] = []

    def writer(i: int) -> None:
        barrier.wait()
        try:
            _, created = _put(repo, argv=["/bin/echo", str(i % 2)])
            outcomes.append(f"{i % 2}:{'created' if created else 'same'}")
        except Conflict:
            outcomes.append(f"{i % 2}:conflict")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    winner = repo.get_revision("job", 1).argv[1]
    assert outcomes.count(f"{winner}:created") == 1
    assert sorted(o for o in outcomes if o.startswith(winner)) == sorted(
        [f"{winner}:created"] + [f"{winner}:same"] * 2
    )
    assert outcomes.count(f"{1 - int(winner)}:conflict") == 3


def test_tasks_and_revisions_list_newest_revision_first(engine: Engine) -> None:
    repo = DefinitionRepository(engine)
    for rev in (1, 2, 3):
        _put(repo, revision=rev)
    _put(repo, revision=1, task="alpha")
    page = repo.list_tasks(limit=1, cursor=None)
    assert page.items == [TaskSummary("alpha", 1)] and page.next_cursor is not None
    assert repo.list_tasks(limit=5, cursor=page.next_cursor).items == [TaskSummary("job", 3)]
    assert [r.revision for r in repo.list_revisions("job", limit=5, cursor=None).items] == [3, 2, 1]
    assert repo.latest_revision("job").revision == 3
    with pytest.raises(NotFound) as info:
        repo.get_revision("job", 9)
    assert info.value.code == ErrorCode.REVISION_NOT_FOUND
