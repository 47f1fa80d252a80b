"""``qinglong runs list --schedule/--since/--until`` (docs/cli.md §3): the forms a user
types for "when", one line for any other, the unknown schedule said, and a ``more:`` line
that asks for the same window however late it is run.

In this process against the real app on a real database, as tests/cli/test_runs_show.py.
"""

from __future__ import annotations

import re

import pytest

from app.cli import main
from app.settings import Settings
from tests.api.conftest import Client
from tests.api.test_runs_window import fire_three_slots
from tests.cli.test_runs_show import _through, app_and_admin

__all__ = ["app_and_admin"]  # the fixture


def test_runs_list_takes_a_window_and_a_schedule_as_a_user_types_them(
    app_and_admin: tuple[Settings, Client, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, app, token = app_and_admin
    fire_three_slots(settings)  # schedule nightly: three runs created in November 2023
    auth = {"Authorization": f"Bearer {token}"}
    manual = [app.post("/api/v1/runs", json={"task": "hello"}, headers=auth).json()["id"]
              for _ in range(2)]  # fmt: skip
    where = _through(monkeypatch, app, token)

    def listed(*args: str) -> tuple[list[str], str]:
        assert main(["runs", "list", *args, *where]) == 0
        out, err = capsys.readouterr()
        return re.findall(r"^([0-9a-f-]{36}) ", out, re.M), err

    scheduled, _ = listed("--schedule", "nightly")
    assert len(scheduled) == 3
    assert listed("--since", "1h")[0] == manual[::-1]  # the two made now, newest first
    assert listed("--until", "2024-01-01")[0] == scheduled  # local midnight
    assert listed("--schedule", "nightly", "--since", "2023-11-01 00:00")[0] == scheduled
    # T0 + 2 s, the middle slot's created time, given with an offset: until leaves it out
    assert listed("--schedule", "nightly", "--until", "2023-11-15T06:00:02+08:00")[0] == [
        scheduled[2]
    ]

    # A relative --since goes into the more: line as the instant it meant.
    ids, err = listed("--since", "1h", "--limit", "1")
    more = re.fullmatch(
        r"more: qinglong runs list --since (\S+) --url \S+ --limit 1 --cursor (\S+)\n", err
    )
    assert ids == [manual[1]] and more, err
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z", more[1]), err  # UTC
    assert listed("--since", more[1], "--limit", "1", "--cursor", more[2])[0] == [manual[0]]

    _, err = listed("--schedule", "weekly")
    assert err == (
        "no runs match these filters: no schedule is named weekly (qinglong schedules list)\n"
    )
    _, err = listed("--schedule", "nightly", "--since", "1m", "--until", "0s")
    assert err == "no runs match these filters\n"  # it exists: the window holds none

    for args, said in (
        (("--since", "yesterday"), "error: --since yesterday: not a time; give 2h, 30m, 1d"),
        (("--until", "2026-12-07 3:00"), "error: --until 2026-12-07 3:00: not a time; give"),
        (("--since", "2026-02-30"), "error: --since 2026-02-30: not a time; give"),
        (("--since", "1h", "--until", "2h"), "error: --since 20"),
    ):
        assert main(["runs", "list", *args, *where]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(said) and err.count("\n") == 1, err
    assert "no run can be in that window" in err
