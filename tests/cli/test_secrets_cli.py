"""``qinglong secrets rotate-key`` end to end through the CLI entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.storage.engine import make_engine
from app.storage.secret_crypto import KeyRing
from app.storage.secrets_repo import SecretRepository


def test_rotate_key_rewrites_rows_and_prints_no_material(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QL_SECRET_KEY", raising=False)
    monkeypatch.delenv("QL_DATABASE_URL", raising=False)
    assert main(["--data-dir", str(tmp_path), "migrate"]) == 0
    engine = make_engine(f"sqlite:///{tmp_path / 'qinglong.db'}")
    try:
        ring = KeyRing.from_settings(secret_key=None, key_file=tmp_path / "secret.key")
        SecretRepository(engine, ring).put(name="pw", value="rotate-me-value")
        old_file = (tmp_path / "secret.key").read_text()
        capsys.readouterr()
        assert main(["--data-dir", str(tmp_path), "secrets", "rotate-key"]) == 0
        out = capsys.readouterr().out
        assert "re-encrypted 1 secret(s)" in out
        assert old_file.split()[1] not in out and "rotate-me-value" not in out
        fresh = KeyRing.from_settings(secret_key=None, key_file=tmp_path / "secret.key")
        assert len(fresh.ids()) == 1 and fresh.ids()[0] != old_file.split()[0]
        assert SecretRepository(engine, fresh).resolve(frozenset({"pw"})) == {
            "pw": "rotate-me-value"
        }
    finally:
        engine.dispose()
