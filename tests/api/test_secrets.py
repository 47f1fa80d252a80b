"""Secrets are write-only and encrypted at rest; the key rotates without losing a value."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from app.domain.errors import KeyUnavailable, SecretsMissing
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.secret_crypto import KeyRing, encode_key, new_key
from app.storage.secrets_repo import SecretRepository
from tests.api.conftest import Client, assert_problem, at_once

PLAINTEXT = "hunter2-VERY-distinctive-plaintext-0f3c"


def _all_bytes_under(root: Path) -> list[tuple[Path, bytes]]:
    found = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            found.append((path, path.read_bytes()))
    return found


def test_secret_plaintext_is_in_no_file_and_no_response(
    client: Client, admin: dict[str, str], settings: Settings
) -> None:
    responses = [
        client.put("/api/v1/secrets/db-password", json={"value": PLAINTEXT}, headers=admin),
        client.put("/api/v1/secrets/db-password", json={"value": PLAINTEXT}, headers=admin),
        client.put("/api/v1/secrets/other", json={"value": PLAINTEXT + "2"}, headers=admin),
        client.get("/api/v1/secrets", headers=admin),
        client.get("/api/v1/secrets/db-password", headers=admin),
        client.post(
            "/api/v1/recipes", json={"secrets": {"DB_PASSWORD": "db-password"}}, headers=admin
        ),
        client.put("/api/v1/secrets/BAD", json={"value": PLAINTEXT}, headers=admin),
        client.put("/api/v1/secrets/x", json={"value": PLAINTEXT + "\u0000"}, headers=admin),
    ]
    assert [r.status_code for r in responses[:4]] == [204, 204, 204, 200]
    listing = responses[3].json()["items"]
    assert [s["name"] for s in listing] == ["db-password", "other"]
    assert set(listing[0]) == {"name", "updated_at_ms"}
    for response in responses:
        assert PLAINTEXT.encode() not in response.content
    needle = PLAINTEXT.encode()
    files = _all_bytes_under(settings.data_dir)
    assert any(p.name == "secret.key" for p, _ in files)
    if settings.database_url.startswith("sqlite"):
        assert any(p.name == "qinglong.db" for p, _ in files)
    for path, data in files:
        assert needle not in data, path
        assert needle.hex().encode() not in data, path
    # ... and the value is really there, for the materializer only.
    engine = make_engine(settings.database_url)
    try:
        ring = KeyRing.from_settings(secret_key=None, key_file=settings.key_file)
        values = SecretRepository(engine, ring).resolve(frozenset({"db-password"}))
        with pytest.raises(SecretsMissing) as missing:
            SecretRepository(engine, ring).resolve(frozenset({"db-password", "b-gone", "a-gone"}))
    finally:
        engine.dispose()
    assert values == {"db-password": PLAINTEXT}
    assert missing.value.names == ("a-gone", "b-gone")  # the names, for the run's ending


def test_key_file_is_private_and_created_once(settings: Settings) -> None:
    first = KeyRing.from_settings(secret_key=None, key_file=settings.key_file)
    assert stat.S_IMODE(settings.key_file.stat().st_mode) == 0o600
    second = KeyRing.from_settings(secret_key=None, key_file=settings.key_file)
    assert first.current.id == second.current.id
    assert "material" not in repr(first.current)


def test_delete_removes_and_then_404s(client: Client, admin: dict[str, str]) -> None:
    client.put("/api/v1/secrets/tmp", json={"value": "v"}, headers=admin)
    assert client.delete("/api/v1/secrets/tmp", headers=admin).status_code == 204
    assert_problem(client.delete("/api/v1/secrets/tmp", headers=admin), 404, "SECRET_NOT_FOUND")
    assert client.get("/api/v1/secrets", headers=admin).json()["items"] == []


def test_puts_and_deletes_of_one_name_at_once_answer_no_500(
    client: Client, admin: dict[str, str]
) -> None:
    # Before: on PostgreSQL a put whose UPDATE found no row (deleted meanwhile) inserted,
    # met another put's insert, and its one retry could meet the same again: 1 to 6 of 20
    # answered 500 INTERNAL_ERROR. SQLite serializes the writes and never showed it.
    url = "/api/v1/secrets/raced"
    for round_ in range(5):
        answers = at_once(client, [
            ("DELETE", url, {"headers": admin}) if i % 3 == 2
            else ("PUT", url, {"json": {"value": f"v{round_}-{i}"}, "headers": admin})
            for i in range(21)
        ])  # fmt: skip
        statuses = [a.status_code for a in answers]
        assert set(statuses) <= {204, 404}, statuses  # a put is 204, a delete 204 or 404
    # Whatever won, the name is there or not, and a put now makes or replaces it.
    assert client.put(url, json={"value": "last"}, headers=admin).status_code == 204
    assert client.delete(url, headers=admin).status_code == 204


def test_rotation_reencrypts_every_row_and_retires_the_old_key(
    settings: Settings, db_url: str
) -> None:
    engine = make_engine(db_url)
    try:
        ring = KeyRing.from_settings(secret_key=None, key_file=settings.key_file)
        repo = SecretRepository(engine, ring)
        for i in range(3):
            repo.put(name=f"s{i}", value=f"value-{i}")
        old = ring.current.id
        rewritten, dropped = repo.rotate()
        assert rewritten == 3
        assert dropped == [old]
        assert ring.ids() == [ring.current.id] and ring.current.id != old
        # A fresh process reading the key file decrypts everything.
        fresh = SecretRepository(
            engine, KeyRing.from_settings(secret_key=None, key_file=settings.key_file)
        )
        assert fresh.resolve(frozenset({"s0", "s1", "s2"})) == {
            f"s{i}": f"value-{i}" for i in range(3)
        }
    finally:
        engine.dispose()


def test_rotation_with_the_environment_key_list(settings: Settings, db_url: str) -> None:
    old_key, new = new_key(), new_key()
    engine = make_engine(db_url)
    try:
        before = KeyRing.from_settings(secret_key=encode_key(old_key), key_file=settings.key_file)
        SecretRepository(engine, before).put(name="s", value="v")
        both = KeyRing.from_settings(
            secret_key=f"{encode_key(new)},{encode_key(old_key)}", key_file=settings.key_file
        )
        assert SecretRepository(engine, both).rotate() == (1, [])
        after = KeyRing.from_settings(secret_key=encode_key(new), key_file=settings.key_file)
        assert SecretRepository(engine, after).resolve(frozenset({"s"})) == {"s": "v"}
        with pytest.raises(KeyUnavailable):
            SecretRepository(engine, before).resolve(frozenset({"s"}))
    finally:
        engine.dispose()
    assert not settings.key_file.exists()  # the environment key never writes a key file


def test_a_malformed_environment_key_is_refused_without_echoing_it(settings: Settings) -> None:
    with pytest.raises(ValueError, match="base64url of 32 bytes") as info:
        KeyRing.from_settings(secret_key="not-a-key-at-all", key_file=settings.key_file)
    assert "not-a-key-at-all" not in str(info.value)
