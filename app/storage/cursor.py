"""Opaque keyset cursors: base64url of canonical JSON of the last row's sort key."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from app.domain.canonical import canonical_json
from app.domain.errors import ErrorCode, ValidationFailed


def encode_cursor(kind: str, key: list[Any]) -> str:
    """Encode the sort key of the last row of a page."""
    raw = canonical_json({"k": kind, "v": key})
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(kind: str, cursor: str, types: tuple[type, ...]) -> list[Any]:
    """Decode a cursor made by ``encode_cursor`` for ``kind``; refuse anything else."""
    try:
        if len(cursor) > 512:
            raise ValueError("too long")
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        if not isinstance(data, dict) or data.get("k") != kind:
            raise ValueError("wrong kind")
        values = data["v"]
        if not isinstance(values, list) or len(values) != len(types):
            raise ValueError("wrong shape")
        for value, expected in zip(values, types, strict=True):
            if isinstance(value, bool) or not isinstance(value, expected):
                raise ValueError("wrong type")
            if isinstance(value, str) and ("\x00" in value or not value.isprintable()):
                raise ValueError("not storable text")  # NUL/surrogates would reach the driver
            if isinstance(value, int) and not -(2**63) <= value < 2**63:
                raise ValueError("out of range")  # SQLite cannot bind it
        return values
    except (ValueError, KeyError, binascii.Error, UnicodeError, TypeError):
        raise ValidationFailed(ErrorCode.INVALID_CURSOR, "the cursor is not valid") from None
