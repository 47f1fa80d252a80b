"""API token format and scopes (docs/api.md §1)."""

from __future__ import annotations

import re
import secrets

TOKEN_PREFIX = "ql_"
TOKEN_PATTERN = re.compile(r"ql_[A-Za-z0-9_-]{43}")
ADMIN = "admin"
SCOPES = frozenset(
    {
        "definitions:read",
        "definitions:write",
        "runs:read",
        "runs:write",
        "logs:read",
        "secrets:write",
        "metrics:read",
        ADMIN,
    }
)


def new_api_token() -> str:
    """A fresh token: ``ql_`` and 43 base64url characters (256 random bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_callback_token() -> str:
    """A fresh 256-bit callback capability for one attempt (docs/design.md §3.7)."""
    return secrets.token_urlsafe(32)


def looks_like_token(text: str) -> bool:
    """True when ``text`` has the shape of an API token."""
    return TOKEN_PATTERN.fullmatch(text) is not None


def grants(held: frozenset[str], needed: str) -> bool:
    """True when the scopes ``held`` include ``needed`` (``admin`` implies all)."""
    return ADMIN in held or needed in held
