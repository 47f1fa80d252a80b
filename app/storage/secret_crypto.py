"""AES-256-GCM for secret values, with a key ring so the key can be rotated.

Where the keys come from (decided here, documented in api-schemas/README.md):

- ``QL_SECRET_KEY`` set: a comma-separated list of base64url 32-byte keys. The first one
  encrypts; the others stay readable. Rotating means prepending a new key, running
  ``qinglong secrets rotate-key`` (re-encrypts every row under the first key), then
  removing the old keys from the variable.
- Otherwise a key file ``<data dir>/secret.key`` (0600, created on first use with O_EXCL):
  one ``<key id> <base64url key>`` per line, the first line encrypts. ``rotate-key``
  prepends a fresh key (atomic replace), re-encrypts every row, and only then drops the
  keys no row uses any more, so an interrupted rotation leaves every row readable.

A key id is a fingerprint of the key (never the key). The nonce is 96 random bits per
encryption; the associated data binds a ciphertext to its secret's name and key id, so a
row copied onto another name does not decrypt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.domain.errors import KeyUnavailable
from app.storage.durable import fsync_dir, sweep_temps
from app.storage.private_files import not_private

KEY_BYTES = 32
NONCE_BYTES = 12


@dataclass(frozen=True, slots=True)
class SecretKey:
    """One 256-bit key and its fingerprint id. ``repr`` never shows the material."""

    id: str
    material: bytes

    def __repr__(self) -> str:
        return f"SecretKey(id={self.id!r})"


def key_id_of(material: bytes) -> str:
    """A stable, non-reversible id for a key: ``k`` + 16 hex of a domain-separated hash."""
    return "k" + hashlib.sha256(b"qinglong-secret-key-id\x00" + material).hexdigest()[:16]


def new_key() -> SecretKey:
    """A fresh random key."""
    material = secrets.token_bytes(KEY_BYTES)
    return SecretKey(id=key_id_of(material), material=material)


def encode_key(key: SecretKey) -> str:
    """base64url without padding (the form ``QL_SECRET_KEY`` accepts)."""
    return base64.urlsafe_b64encode(key.material).decode("ascii").rstrip("=")


def decode_key(text: str) -> SecretKey:
    """Parse one base64url 32-byte key; ValueError (without echoing it) otherwise."""
    try:
        raw = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("a secret key must be base64url of 32 bytes") from None
    if len(raw) != KEY_BYTES:
        raise ValueError("a secret key must be base64url of 32 bytes")
    return SecretKey(id=key_id_of(raw), material=raw)


def _aad(name: str, key_id: str) -> bytes:
    return f"qinglong-secret\x00{name}\x00{key_id}".encode()


class KeyRing:
    """The current key plus older keys that still decrypt; reloads a changed key file."""

    def __init__(self, keys: list[SecretKey], *, path: Path | None = None) -> None:
        if not keys:
            raise ValueError("a key ring needs at least one key")
        self._keys = list(keys)
        self._path = path
        self._stamp = _stamp(path) if path is not None else None

    @classmethod
    def from_settings(cls, *, secret_key: str | None, key_file: Path) -> KeyRing:
        """Keys from ``QL_SECRET_KEY`` when set, else the key file (created on first use)."""
        if secret_key:
            keys = [decode_key(part) for part in secret_key.split(",") if part.strip()]
            return cls(keys)
        return cls(_load_or_create(key_file), path=key_file)

    @property
    def current(self) -> SecretKey:
        """The key new ciphertexts use."""
        self._refresh()
        return self._keys[0]

    @property
    def file_backed(self) -> bool:
        """True when the ring lives in the key file (rotation can write it)."""
        return self._path is not None

    def key(self, key_id: str) -> SecretKey:
        """The key with ``key_id``; KeyUnavailable if the ring does not hold it."""
        self._refresh()
        for key in self._keys:
            if key.id == key_id:
                return key
        raise KeyUnavailable(f"key {key_id} is not in the key ring")

    def ids(self) -> list[str]:
        """Ids of every key, current first."""
        self._refresh()
        return [k.id for k in self._keys]

    def encrypt(self, *, name: str, plaintext: str) -> tuple[str, bytes, bytes]:
        """``(key_id, nonce, ciphertext)`` of ``plaintext`` under the current key."""
        key = self.current
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(key.material).encrypt(nonce, plaintext.encode("utf-8"), _aad(name, key.id))
        return key.id, nonce, sealed

    def decrypt(self, *, name: str, key_id: str, nonce: bytes, ciphertext: bytes) -> str:
        """The plaintext; KeyUnavailable when the key is missing or the row was tampered with."""
        key = self.key(key_id)
        try:
            raw = AESGCM(key.material).decrypt(nonce, ciphertext, _aad(name, key_id))
        except InvalidTag:
            raise KeyUnavailable(f"secret {name} does not decrypt under key {key_id}") from None
        return raw.decode("utf-8")

    # -- rotation (file-backed rings only) --------------------------------------------------

    def prepend_new_key(self) -> SecretKey:
        """Make a fresh key current, keeping every old key readable (atomic file replace)."""
        if self._path is None:
            raise ValueError("QL_SECRET_KEY is set: put the new key first in QL_SECRET_KEY instead")
        self._refresh()
        key = new_key()
        _write_ring(self._path, [key, *self._keys])
        self._keys = [key, *self._keys]
        self._stamp = _stamp(self._path)
        return key

    def keep_only(self, key_ids: set[str]) -> list[str]:
        """Drop keys whose ids are not in ``key_ids`` (the current one always stays)."""
        if self._path is None:
            return []
        self._refresh()
        keep = [k for i, k in enumerate(self._keys) if i == 0 or k.id in key_ids]
        dropped = [k.id for k in self._keys if k not in keep]
        if dropped:
            _write_ring(self._path, keep)
            self._keys = keep
            self._stamp = _stamp(self._path)
        return dropped

    def _refresh(self) -> None:
        # Another process (`qinglong secrets rotate-key`) may have replaced the file.
        if self._path is None:
            return
        stamp = _stamp(self._path)
        if stamp != self._stamp:
            self._keys = _read_ring(self._path)
            self._stamp = stamp


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _read_ring(path: Path) -> list[SecretKey]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "r", encoding="ascii") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if mode & 0o077:
            raise not_private([(path, mode)])
        lines = [line.split() for line in fh if line.strip()]
    keys: list[SecretKey] = []
    for parts in lines:
        if len(parts) != 2:
            raise ValueError(f"{path} is malformed")
        key = decode_key(parts[1])
        if key.id != parts[0]:
            raise ValueError(f"{path} is malformed (key id mismatch)")
        keys.append(key)
    if not keys:
        raise ValueError(f"{path} holds no key")
    return keys


def _ring_text(keys: list[SecretKey]) -> bytes:
    return "".join(f"{k.id} {encode_key(k)}\n" for k in keys).encode("ascii")


_TEMP_BYTES = 6  # of a temp file's random name part (``sweep_key_temps``)


def sweep_key_temps(path: Path) -> int:
    """Remove the temp files a killed write of the key file ``path`` left (a whole key
    each, or a second name of the live one): ``sweep_temps``. Run at each start."""
    return sweep_temps(path, 2 * _TEMP_BYTES)


def _load_or_create(path: Path) -> list[SecretKey]:
    try:
        return _read_ring(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = new_key()
    # Written whole under a temp name, then linked into place (never replacing): a file made
    # in place and refused its bytes (a full disk) stayed empty, and every later start was
    # refused "holds no key"; a concurrent first start could read it empty too.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(_TEMP_BYTES)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.write(fd, _ring_text([key]))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:  # another process published one first: use theirs
            return _read_ring(path)
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
    return [key]


def _write_ring(path: Path, keys: list[SecretKey]) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(_TEMP_BYTES)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, _ring_text(keys))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
