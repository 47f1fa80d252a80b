"""``qinglong logs audit``: log files no attempt row names; read-only unless asked
(docs/retention.md §6)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from app.cli import main
from app.domain.artifacts import log_relpath
from app.domain.ids import now_ms, uuid7
from app.storage.tables import attempts
from tests.storage.retention_kit import DAY_MS, seed

OLD = 10_000.0


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


def _age(path: Path) -> None:
    t = path.stat().st_mtime - OLD
    os.utime(path, (t, t))


def _audit(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, str]:
    assert main(["logs", "audit", "--shards", "32", "--min-age-s", "60", *args]) == 0
    out = capsys.readouterr().out
    return dict(line.split(": ", 1) for line in out.splitlines())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_logs_audit_reports_orphans_and_moves_them_only_when_asked(
    engine: Engine, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = data / "logs"
    kept, gone = seed(engine, root, tasks=["t"], runs_per_task=2, start_ms=now_ms() - DAY_MS)
    with engine.begin() as conn:  # the row says expired, yet the file is there
        conn.execute(update(attempts).where(attempts.c.id == gone.attempt_id).values(
            log_state="expired"))  # fmt: skip
    orphan = root / log_relpath(uuid7())
    orphan.parent.mkdir(mode=0o700, exist_ok=True)
    orphan.write_bytes(b"left over")
    for attempt in (kept.attempt_id, gone.attempt_id):
        _age(root / log_relpath(attempt))
    _age(orphan)
    shards = {Path(log_relpath(a)).parent.name for a in (kept.attempt_id, gone.attempt_id)}
    shards.add(orphan.parent.name)

    seen: dict[str, int] = {}
    for shard in sorted(shards):
        report = _audit(capsys, "--shard", shard, "--shards", "1")
        for key in ("registered", "orphan", "expired_leftover"):
            seen[key] = seen.get(key, 0) + int(report.get(key, "0"))
        assert "moved" not in report  # read-only by default
    assert seen == {"registered": 1, "orphan": 1, "expired_leftover": 1}
    assert orphan.exists()

    for shard in sorted(shards):
        _audit(capsys, "--shard", shard, "--shards", "1", "--quarantine")
    assert not orphan.exists() and not (root / log_relpath(gone.attempt_id)).exists()
    assert (root / log_relpath(kept.attempt_id)).exists()  # a registered log never moves
    assert (root / ".orphan-quarantine" / orphan.parent.name / orphan.name).exists()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_logs_audit_refuses_a_shard_that_leads_out_of_the_root_and_moves_nothing(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = data / "logs"
    root.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / f"{uuid7()}.log"
    victim.write_bytes(b"not ours")
    _age(victim)
    (root / "00").symlink_to(outside)
    assert main(["logs", "audit", "--shard", "00", "--quarantine", "--min-age-s", "0"]) == 1
    err = capsys.readouterr().err
    assert "logs audit refused" in err and "00 under" in err
    assert "receipts" not in err  # the refusal names the logs' own root
    assert victim.read_bytes() == b"not ours"
    assert not (root / ".orphan-quarantine").exists()
