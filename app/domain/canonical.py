"""Canonical JSON and content digests (sorted keys, compact separators, UTF-8)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Serialize ``value`` to canonical JSON bytes: sorted keys, no whitespace, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_digest(data: bytes) -> str:
    """Return ``sha256:<64 hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def content_digest(value: Any) -> str:
    """Digest of the canonical JSON of ``value``."""
    return sha256_digest(canonical_json(value))


def recipe_id(env: dict[str, str], secrets: dict[str, str]) -> str:
    """Content address of a context recipe: ``localctx:sha256:<hex>``."""
    return "localctx:" + content_digest({"env": env, "secrets": secrets})
