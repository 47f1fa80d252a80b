"""``qinglong secrets rotate-key`` end to end through the CLI entry point."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from app.storage.engine import make_engine
from app.storage.secret_crypto import KeyRing, encode_key, new_key
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
        # --data-dir after the command, as docs/api.md §8 says every command takes it.
        assert main(["secrets", "rotate-key", "--data-dir", str(tmp_path)]) == 0
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


def test_rotating_with_a_ring_that_lacks_a_used_key_is_one_line_and_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QL_DATABASE_URL", raising=False)
    old, new = new_key(), new_key()
    monkeypatch.setenv("QL_SECRET_KEY", encode_key(old))
    assert main(["--data-dir", str(tmp_path), "migrate"]) == 0
    engine = make_engine(f"sqlite:///{tmp_path / 'qinglong.db'}")
    try:
        ring = KeyRing.from_settings(secret_key=encode_key(old), key_file=tmp_path / "secret.key")
        SecretRepository(engine, ring).put(name="pw", value="kept-value")
        monkeypatch.setenv("QL_SECRET_KEY", encode_key(new))  # the old key left out by mistake
        capsys.readouterr()
        assert main(["--data-dir", str(tmp_path), "secrets", "rotate-key"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("qinglong: key ") and "list the new key first" in err
        assert "Traceback" not in err and encode_key(old) not in err and encode_key(new) not in err
        assert SecretRepository(engine, ring).resolve(frozenset({"pw"})) == {"pw": "kept-value"}
    finally:
        engine.dispose()


def test_root_on_another_users_data_dir_is_refused_before_anything_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can write into another user's data dir")
    data = tmp_path / "theirs"
    data.mkdir(mode=0o700)
    os.chown(data, 65534, 65534)
    for command in (["secrets", "rotate-key"], ["migrate"], ["token", "list"]):
        assert main(["--data-dir", str(data), *command]) == 2
        err = capsys.readouterr().err
        assert f"the data dir {data} belongs to " in err and "(uid 65534)" in err, err
    assert list(data.iterdir()) == []  # no root-owned file was left there


@pytest.fixture
def in_process_service() -> Iterator[None]:
    """``api`` and ``serve`` run in this process: what they set up for their children (the
    environment, the supervisor's log handler) is undone, so later tests of this worker do
    not inherit a metrics dir that is gone."""
    environ = dict(os.environ)
    supervisor_log = logging.getLogger("qinglong.supervisor")
    handlers = list(supervisor_log.handlers)
    yield
    os.environ.clear()
    os.environ.update(environ)
    supervisor_log.handlers[:] = handlers


@pytest.mark.usefixtures("in_process_service")
@pytest.mark.parametrize("command", ["api", "serve", "rotate-key"])
def test_a_data_dir_restored_without_its_key_file_is_refused_not_given_a_new_key(
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A backup put back without secret.key (docs/operations.md §3 keeps it apart): a key made
    # now decrypts none of the stored secrets, and a secret set under it would be lost once
    # the right key file is put back. The services and rotate-key refuse with one line.
    from app.cli import serve as serve_cli
    from app.supervisor.supervisor import Supervisor
    from tests.e2e.conftest import free_port

    monkeypatch.delenv("QL_SECRET_KEY", raising=False)
    monkeypatch.delenv("QL_DATABASE_URL", raising=False)
    monkeypatch.setenv("QL_WORKER_SOCKET", str(tmp_path / "w.sock"))
    served: list[str] = []
    monkeypatch.setattr(serve_cli, "_run_uvicorn", lambda *a: served.append("api") or 0)
    monkeypatch.setattr(Supervisor, "run", lambda self: served.append("serve") or 0)
    assert main(["--data-dir", str(tmp_path), "migrate"]) == 0
    key_file = tmp_path / "secret.key"
    engine = make_engine(f"sqlite:///{tmp_path / 'qinglong.db'}")
    try:
        ring = KeyRing.from_settings(secret_key=None, key_file=key_file)
        SecretRepository(engine, ring).put(name="pw", value="restored-value")
        old_id = ring.current.id
        key_file.unlink()  # the restore left it out
        capsys.readouterr()
        argv = {
            "api": ["api", "--port", str(free_port())],
            "serve": ["serve", "--port", str(free_port())],
            "rotate-key": ["secrets", "rotate-key"],
        }[command]
        assert main(["--data-dir", str(tmp_path), *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"qinglong: no key file at {key_file}"), err
        assert old_id in err and "restore the secret.key" in err and "Traceback" not in err
        assert "QL_SECRET_KEY on every host" in err and "decrypt under this key ring" not in err
        assert "restored-value" not in err
        assert served == [] and not key_file.exists()  # nothing started, no new key made
    finally:
        engine.dispose()


@pytest.mark.usefixtures("in_process_service")
def test_no_key_file_is_made_while_the_database_cannot_say_whether_it_holds_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new host of a shared PostgreSQL started before the server answers: a key made now
    # could be one no stored secret decrypts under (the second review).
    from app.cli import serve as serve_cli
    from tests.e2e.conftest import free_port

    monkeypatch.delenv("QL_SECRET_KEY", raising=False)
    monkeypatch.setenv("QL_DATABASE_URL", f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    served: list[str] = []
    monkeypatch.setattr(serve_cli, "_run_uvicorn", lambda *a: served.append("api") or 0)
    assert main(["--data-dir", str(tmp_path), "api", "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    assert err.startswith("qinglong: no key file at ") and "could not be read (" in err, err
    assert "Connection refused" in err and "start again once it can be read" in err
    assert "Traceback" not in err
    assert served == [] and not (tmp_path / "secret.key").exists()


@pytest.mark.usefixtures("in_process_service")
def test_a_fresh_data_dir_still_gets_its_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.cli import serve as serve_cli
    from tests.e2e.conftest import free_port

    monkeypatch.delenv("QL_SECRET_KEY", raising=False)
    monkeypatch.delenv("QL_DATABASE_URL", raising=False)
    served: list[str] = []
    monkeypatch.setattr(serve_cli, "_run_uvicorn", lambda *a: served.append("api") or 0)
    # Not migrated yet, then migrated without secrets: no refusal either way.
    assert main(["--data-dir", str(tmp_path), "api", "--port", str(free_port())]) == 0
    assert main(["--data-dir", str(tmp_path), "migrate"]) == 0
    assert main(["--data-dir", str(tmp_path), "secrets", "rotate-key"]) == 0
    assert served == ["api"] and (tmp_path / "secret.key").exists()
