"""``qinglong receipts audit``: bounded, read-only by default, fail closed (docs/design.md §3.15)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.cli import main
from app.domain.artifacts import receipt_relpath
from app.domain.ids import uuid7
from app.storage.journal_repo import JournalRepository
from tests.worker.kit import armed_run

OLD = 10_000.0  # seconds of age given to "old" files


def _attempt_in(shard: str) -> str:
    while True:
        attempt = uuid7()
        if attempt.endswith(shard):
            return attempt


def _file(path: Path, *, old: bool = True) -> Path:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(b"{}")
    if old:
        t = path.stat().st_mtime - OLD
        os.utime(path, (t, t))
    return path


@pytest.fixture
def data(engine: Engine, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    for key in list(os.environ):
        if key.startswith("QL_") and key != "QL_TEST_POSTGRES_URL":
            monkeypatch.delenv(key)
    monkeypatch.setenv("QL_DATA_DIR", str(data_dir))
    monkeypatch.setenv("QL_DATABASE_URL", db_url)
    return data_dir


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, str]]:
    code = main(["receipts", "audit", "--min-age-s", "60", *args])
    out = capsys.readouterr().out
    return code, dict(line.split(": ", 1) for line in out.splitlines())


def test_audit_classifies_and_only_quarantine_moves_eligible_files(
    engine: Engine, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = data / "receipts"
    journaled = armed_run(engine)
    JournalRepository(engine).reserve(
        attempt_id=journaled.attempt_id, run_id=journaled.run_id,
        receipt_ref=receipt_relpath(journaled.attempt_id),
    )
    active = armed_run(engine)  # starting, not journaled (an upgrade leftover)
    kept = [
        _file(root / receipt_relpath(journaled.attempt_id)),
        _file(root / receipt_relpath(active.attempt_id)),
    ]
    shard = "3c"
    orphan = _attempt_in(shard)
    eligible = [
        _file(root / receipt_relpath(orphan)),
        _file(root / shard / f".{_attempt_in(shard)}.json.tmp"),
        _file(root / shard / "stray.bin"),
    ]
    young = _file(root / shard / "fresh.bin", old=False)
    (root / shard / "adir").mkdir()
    (root / shard / "link.json").symlink_to(eligible[2])
    shards = sorted({p.parent.name for p in kept} | {shard})
    totals: Counter[str] = Counter()
    for one in shards:
        code, out = _run(capsys, "--shard", one, "--shards", "1", "--per-shard", "64")
        assert code == 0 and out.pop("next shard") == f"{(int(one, 16) + 1) % 256:02x}"
        assert out.pop("shards audited") == f"{one}..{one}"
        assert int(out.pop("entries found")) == sum(int(v) for v in out.values())
        totals.update({k: int(v) for k, v in out.items()})
    assert totals == {"eligible": 3, "unsafe": 2, "young": 1, "registered": 1, "active": 1}
    assert all(p.exists() for p in [*kept, *eligible, young])  # read-only by default
    moved = 0
    for one in shards:
        code, out = _run(capsys, "--shard", one, "--shards", "1", "--quarantine")
        assert code == 0
        moved += int(out["moved"])
    assert moved == 3
    assert all(p.exists() for p in [*kept, young]) and not any(p.exists() for p in eligible)
    qdir = root / ".orphan-quarantine" / shard
    assert sorted(p.name for p in qdir.iterdir()) == sorted(p.name for p in eligible)
    assert (qdir.stat().st_mode & 0o777) == 0o700
    assert (root / shard / "link.json").is_symlink() and (root / shard / "adir").is_dir()


def test_an_overflowing_shard_moves_nothing_and_the_window_wraps(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = data / "receipts"
    files = [_file(root / "ff" / f"stray{i}") for i in range(3)]
    code, out = _run(capsys, "--shard", "fe", "--shards", "4", "--per-shard", "2", "--quarantine")
    assert code == 0
    assert out["overflow shards"] == "ff" and out["moved"] == "0" and out["eligible"] == "2"
    assert out["next shard"] == "02"
    assert out["shards audited"] == "fe..01"  # the window wraps past ff
    assert all(p.exists() for p in files)


def test_an_empty_window_says_it_found_nothing(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (data / "receipts").mkdir(exist_ok=True)
    code, out = _run(capsys, "--shard", "10", "--shards", "8")
    assert (code, out) == (
        0, {"shards audited": "10..17", "entries found": "0", "next shard": "18"}
    )  # fmt: skip


def test_bounds_and_symlink_escape_are_refused(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["receipts", "audit", "--shards", "33"]) == 2
    assert main(["receipts", "audit", "--per-shard", "65"]) == 2
    assert main(["receipts", "audit", "--shard", "zz"]) == 2
    root = data / "receipts"
    root.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir()
    _file(outside / "victim")
    (root / "00").symlink_to(outside)
    assert main(["receipts", "audit", "--shard", "00", "--quarantine", "--min-age-s", "0"]) == 1
    assert "refused" in capsys.readouterr().err
    assert (outside / "victim").exists()
