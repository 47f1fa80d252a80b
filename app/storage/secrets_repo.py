"""Write-only secrets, encrypted at rest (AES-GCM, see secret_crypto); values leave via resolve."""

from __future__ import annotations

from sqlalchemy import Engine, delete, insert, select, update

from app.domain.errors import ErrorCode, NotFound, SecretsMissing
from app.domain.ids import now_ms
from app.domain.model import Page, SecretName
from app.storage.cursor import decode_cursor, encode_cursor
from app.storage.secret_crypto import KeyRing
from app.storage.tables import secrets
from app.storage.uow import UnitOfWork, retried_on_duplicate

# How often a put tries its UPDATE-or-INSERT (``put``).
PUT_TRIES = 8


class SecretRepository:
    """Put, list, delete and (for the materializer only) resolve secret values."""

    def __init__(self, engine: Engine, ring: KeyRing) -> None:
        self._engine = engine
        self._ring = ring

    def put(self, *, name: str, value: str) -> bool:
        """Encrypt and store ``value`` under ``name``; True when the name is new."""
        key_id, nonce, sealed = self._ring.encrypt(name=name, plaintext=value)
        at = now_ms()
        # A delete may take the row another put inserted before our next UPDATE, and a third
        # put win the insert again: the tries run out only under a storm of puts and deletes
        # of one name (20 at once lost one in four with a single retry).
        return retried_on_duplicate(
            lambda: self._put_once(name, key_id, nonce, sealed, at), tries=PUT_TRIES
        )

    def _put_once(self, name: str, key_id: str, nonce: bytes, sealed: bytes, at: int) -> bool:
        # BEGIN IMMEDIATE serializes this on SQLite; on PostgreSQL the UPDATE locks an
        # existing row, and the primary key refuses a second insert of a new name.
        with UnitOfWork(self._engine) as uow:
            changed = uow.conn.execute(
                update(secrets)
                .where(secrets.c.name == name)
                .values(key_id=key_id, nonce=nonce, ciphertext=sealed, updated_at_ms=at)
            ).rowcount
            if not changed:
                uow.conn.execute(
                    insert(secrets).values(
                        name=name,
                        key_id=key_id,
                        nonce=nonce,
                        ciphertext=sealed,
                        created_at_ms=at,
                        updated_at_ms=at,
                    )
                )
            uow.commit()
        return not changed

    def list_names(self, *, limit: int, cursor: str | None) -> Page[SecretName]:
        """Names by name, one keyset page; never values."""
        query = select(secrets.c.name, secrets.c.updated_at_ms)
        if cursor is not None:
            (last,) = decode_cursor("secrets", cursor, (str,))
            query = query.where(secrets.c.name > last)
        query = query.order_by(secrets.c.name).limit(limit + 1)
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query).all()
        items = [SecretName(name=r.name, updated_at_ms=r.updated_at_ms) for r in rows[:limit]]
        nxt = encode_cursor("secrets", [items[-1].name]) if len(rows) > limit else None
        return Page(items=items, next_cursor=nxt)

    def delete(self, name: str) -> None:
        """Remove a secret; NotFound(SECRET_NOT_FOUND) if there is none."""
        with UnitOfWork(self._engine) as uow:
            gone = uow.conn.execute(delete(secrets).where(secrets.c.name == name)).rowcount
            if not gone:
                raise NotFound(ErrorCode.SECRET_NOT_FOUND, f"no secret named {name}")
            uow.commit()

    def resolve(self, names: frozenset[str]) -> dict[str, str]:
        """Decrypted values by name (the SecretSource port); SecretsMissing if any is missing."""
        if not names:
            return {}
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(select(secrets).where(secrets.c.name.in_(sorted(names)))).all()
        found = {r.name: r for r in rows}
        missing = sorted(names - set(found))
        if missing:
            raise SecretsMissing(missing)
        return {
            n: self._ring.decrypt(name=n, key_id=r.key_id, nonce=r.nonce, ciphertext=r.ciphertext)
            for n, r in found.items()
        }

    def rotate(self, *, new_key: bool = True) -> tuple[int, list[str]]:
        """Re-encrypt every row under the (new) current key; ``(rows rewritten, keys dropped)``.

        Old keys stay in the ring until no row names them; the loop re-checks, so a row
        written under an old key by a process that had not yet seen the new ring is caught.
        """
        if new_key and self._ring.file_backed:
            self._ring.prepend_new_key()
        current = self._ring.current.id
        rewritten = 0
        for _ in range(5):
            with UnitOfWork(self._engine, write=False) as uow:
                stale = (
                    uow.conn.execute(select(secrets.c.name).where(secrets.c.key_id != current))
                    .scalars()
                    .all()
                )
            if not stale:
                break
            for name in stale:
                rewritten += self._reencrypt(name, current)
        return rewritten, self._ring.keep_only(set(stored_key_ids(self._engine)))

    def _reencrypt(self, name: str, current: str) -> int:
        with UnitOfWork(self._engine) as uow:
            row = uow.conn.execute(select(secrets).where(secrets.c.name == name)).first()
            if row is None or row.key_id == current:
                return 0
            value = self._ring.decrypt(
                name=name, key_id=row.key_id, nonce=row.nonce, ciphertext=row.ciphertext
            )
            key_id, nonce, sealed = self._ring.encrypt(name=name, plaintext=value)
            uow.conn.execute(
                update(secrets)
                .where(secrets.c.name == name, secrets.c.key_id == row.key_id)
                .values(key_id=key_id, nonce=nonce, ciphertext=sealed)
            )
            uow.commit()
        return 1


def stored_key_ids(engine: Engine) -> list[str]:
    """The ids of the keys the stored secrets are sealed under, sorted (none: no secret). No
    key ring needed: ``qinglong serve`` asks before it has one (app/cli/common.py)."""
    with UnitOfWork(engine, write=False) as uow:
        return sorted(uow.conn.execute(select(secrets.c.key_id).distinct()).scalars())
