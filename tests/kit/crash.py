"""A raise injected inside a transition's transaction, after its writes, before its commit."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

import app.storage.runs_repo as runs_repo


def crash_in_step(monkeypatch: pytest.MonkeyPatch, engine: Engine, message: str) -> None:
    """The next run+attempt step (``runs_repo._step``) raises ``RuntimeError(message)``.

    On SQLite at its events, the last of its three statements (run and attempt already
    updated); on PostgreSQL right after its one statement (app/storage/one_step.py), all of
    it written in the transaction. ``monkeypatch.undo()`` ends it.
    """
    if engine.dialect.name == "postgresql":
        write_step = runs_repo.write_step

        def after(*args: Any, **kwargs: Any) -> tuple[bool, dict[str, int]]:
            took, _counts = write_step(*args, **kwargs)
            assert took
            raise RuntimeError(message)

        monkeypatch.setattr(runs_repo, "write_step", after)
        return

    def instead(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError(message)

    monkeypatch.setattr(runs_repo, "_append_events", instead)
