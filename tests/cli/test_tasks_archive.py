"""``qinglong tasks archive|unarchive`` and ``tasks list --archived|--all`` (docs/cli.md),
in this process against the real app on a real database, both engines."""

from __future__ import annotations

import re

import pytest

from app.cli import main
from app.settings import Settings
from tests.api.conftest import Client
from tests.cli.test_runs_show import _through, app_and_admin

__all__ = ["app_and_admin"]  # the fixture: the app, an admin token and task ``hello``


def test_archive_hides_a_task_from_the_list_refuses_runs_and_unarchive_undoes_it(
    app_and_admin: tuple[Settings, Client, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _settings, app, token = app_and_admin
    auth = {"Authorization": f"Bearer {token}"}
    other = app.put("/api/v1/tasks/other/revisions/1", json={"argv": ["/bin/true"]}, headers=auth)
    assert other.status_code == 201
    where = _through(monkeypatch, app, token)

    assert main(["tasks", "archive", "hello", *where]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(
        r"task hello archived \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: left out of tasks list, no new "
        r"runs \(qinglong tasks unarchive hello undoes it\)\n", out
    ), out
    assert main(["tasks", "archive", "hello", *where]) == 0  # again: the same, exit 0
    capsys.readouterr()

    assert main(["tasks", "list", *where]) == 0
    assert capsys.readouterr().out.split() == ["TASK", "LATEST", "other", "1"]
    assert main(["tasks", "list", "--archived", *where]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["TASK", "LATEST", "ARCHIVED"] and len(rows) == 2
    assert re.fullmatch(r"hello +1 +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", rows[1]), rows
    assert main(["tasks", "list", "--all", *where]) == 0
    assert [r.split()[:3] for r in capsys.readouterr().out.splitlines()[1:]] == [
        ["hello", "1", rows[1].split()[2]], ["other", "1", "-"],
    ]  # fmt: skip
    assert main(["tasks", "show", "hello", *where]) == 0
    assert re.search(r"^archived: +\d{4}-", capsys.readouterr().out, re.M)

    assert main(["runs", "start", "hello", *where]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: 409 TASK_ARCHIVED: task hello is archived"), err
    assert "unarchive it first" in err

    assert main(["tasks", "unarchive", "hello", *where]) == 0
    assert capsys.readouterr().out == "task hello unarchived: listed again, runs may start\n"
    assert main(["tasks", "list", *where]) == 0
    assert capsys.readouterr().out.split() == ["TASK", "LATEST", "hello", "1", "other", "1"]
    assert main(["tasks", "archive", "nope", *where]) == 3
    assert capsys.readouterr().err.startswith("error: 404 TASK_NOT_FOUND")
    with pytest.raises(SystemExit) as usage:  # one or the other
        main(["tasks", "list", "--archived", "--all", *where])
    assert usage.value.code == 2


def test_a_task_list_with_every_task_archived_points_at_the_archived_list(
    app_and_admin: tuple[Settings, Client, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: "no tasks yet", as if none had ever been defined.
    _settings, app, token = app_and_admin
    where = _through(monkeypatch, app, token)
    assert main(["tasks", "archive", "hello", *where]) == 0
    capsys.readouterr()
    assert main(["tasks", "list", *where]) == 0
    assert capsys.readouterr().err == (
        "no tasks listed: every task is archived (qinglong tasks list --archived)\n"
    )
