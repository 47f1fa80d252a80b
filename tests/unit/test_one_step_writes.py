"""A step's statement carries other writes by name (app/storage/one_step.py, ``Writes``):
the statement built for a shape is found again only for the same UPDATEs, never for
another UPDATE that happens to share a name and a shape."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.dialects import postgresql

from app.domain.model import ProcessHandle
from app.storage.journal_repo import consumed_move, spawned_move
from app.storage.one_step import _execute, _statement

HANDLE = ProcessHandle("boot", 10, 10, 100, 9, 90)


def _sql(writes: dict[str, Any]) -> str:
    statement = _statement(("status", "version"), ("status",), 2, {}, writes)
    return str(statement.compile(dialect=postgresql.dialect()))


def test_two_moves_under_one_name_and_one_shape_are_two_statements() -> None:
    spawned = spawned_move("a1", HANDLE)
    consumed = consumed_move("a1")
    first = _sql({"journal": spawned})
    second = _sql({"journal": consumed})
    assert "jm_handle" in first and "jm_handle" not in second
    assert "w_journal" in first and "w_journal" in second
    assert _sql({"journal": spawned_move("a2", HANDLE)}) == first  # built once, found again


def test_a_parameter_named_as_a_column_of_a_written_table_is_refused() -> None:
    """A riding UPDATE would take ``receipt_ref`` for one more value to SET."""
    update, params = consumed_move("a1")
    with pytest.raises(ValueError, match="named as columns"):
        _execute(None, None, {}, 3, {}, {"journal": (update, {**params, "receipt_ref": "x"})})  # type: ignore[arg-type]
