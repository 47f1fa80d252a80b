"""API tokens: stored only as SHA-256 digests with a name and scopes."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.domain.canonical import sha256_digest
from app.domain.errors import Conflict, ErrorCode, NotFound
from app.domain.ids import now_ms, uuid7
from app.storage.tables import api_tokens
from app.storage.uow import UnitOfWork


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A token's public facts (never its plaintext)."""

    id: str
    name: str
    scopes: frozenset[str]
    created_at_ms: int
    revoked_at_ms: int | None
    expires_at_ms: int | None = None  # None: never

    def state(self, now: int) -> str:
        """``active``, ``revoked`` or ``expired`` at ``now`` (revoked wins)."""
        if self.revoked_at_ms is not None:
            return "revoked"
        if self.expires_at_ms is not None and now >= self.expires_at_ms:
            return "expired"
        return "active"


class TokenRepository:
    """Create, list, revoke and look up tokens by digest."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def create(
        self,
        *,
        name: str,
        scopes: frozenset[str],
        token: str,
        expires_in_ms: int | None = None,
    ) -> TokenRecord:
        """Store the digest of ``token``, valid for ``expires_in_ms`` from now (None: until
        revoked); Conflict if the name is taken."""
        at = now_ms()
        record = TokenRecord(
            id=uuid7(), name=name, scopes=scopes, created_at_ms=at, revoked_at_ms=None,
            expires_at_ms=None if expires_in_ms is None else at + expires_in_ms,
        )  # fmt: skip
        try:
            with UnitOfWork(self._engine) as uow:
                uow.conn.execute(
                    insert(api_tokens).values(
                        id=record.id,
                        name=name,
                        digest=sha256_digest(token.encode("utf-8")),
                        scopes=" ".join(sorted(scopes)),
                        created_at_ms=record.created_at_ms,
                        expires_at_ms=record.expires_at_ms,
                    )
                )
                uow.commit()
        except IntegrityError:
            with UnitOfWork(self._engine, write=False) as uow:
                revoked = uow.conn.execute(
                    select(api_tokens.c.revoked_at_ms).where(api_tokens.c.name == name)
                ).scalar() is not None
            detail = (
                f"a token named {name} was revoked; a name is never reused, choose another"
                if revoked
                else f"a token named {name} exists"
            )
            raise Conflict(ErrorCode.VALIDATION_FAILED, detail) from None
        return record

    def list(self) -> list[TokenRecord]:
        """Every token, oldest first."""
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(select(api_tokens).order_by(api_tokens.c.id)).all()
        return [_record(r) for r in rows]

    def revoke(self, name: str) -> tuple[TokenRecord, bool]:
        """Mark a token revoked (idempotent): the record, and whether this call revoked it
        (False: it was revoked already). NotFound for an unknown name."""
        with UnitOfWork(self._engine) as uow:
            changed = uow.conn.execute(
                update(api_tokens)
                .where(api_tokens.c.name == name, api_tokens.c.revoked_at_ms.is_(None))
                .values(revoked_at_ms=now_ms())
            ).rowcount
            row = uow.conn.execute(select(api_tokens).where(api_tokens.c.name == name)).first()
            if row is None:
                raise NotFound(ErrorCode.VALIDATION_FAILED, f"no token named {name}")
            uow.commit()
        return _record(row), changed == 1

    def authenticate(self, token: str) -> TokenRecord | None:
        """The live token whose digest matches ``token``, compared in constant time."""
        digest = sha256_digest(token.encode("utf-8", "surrogatepass"))
        with UnitOfWork(self._engine, write=False) as uow:
            row = uow.conn.execute(select(api_tokens).where(api_tokens.c.digest == digest)).first()
        # The lookup is by digest (an index probe that leaks nothing about the plaintext);
        # compare again in constant time so equality is never decided by a short-circuit.
        if row is None or not hmac.compare_digest(row.digest, digest):
            return None
        record = _record(row)
        if record.state(now_ms()) != "active":
            return None  # revoked, or past its expiry
        return record


def _record(row: object) -> TokenRecord:
    return TokenRecord(
        id=row.id,  # type: ignore[attr-defined]
        name=row.name,  # type: ignore[attr-defined]
        scopes=frozenset(row.scopes.split()),  # type: ignore[attr-defined]
        created_at_ms=row.created_at_ms,  # type: ignore[attr-defined]
        revoked_at_ms=row.revoked_at_ms,  # type: ignore[attr-defined]
        expires_at_ms=row.expires_at_ms,  # type: ignore[attr-defined]
    )
