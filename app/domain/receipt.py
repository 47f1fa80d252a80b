"""Completion receipt: strict codec for the fact a shim publishes when its job ended.

The wire form (``api-schemas/completion-receipt.schema.json``) is canonical JSON of a fixed
object of at most 4 KiB. Decoding is strict and never repairs anything: every deviation is
a :class:`ReceiptInvalid` with a stable machine ``reason``; messages never echo content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from app.domain.canonical import canonical_json
from app.domain.errors import ReceiptInvalid
from app.domain.ids import is_uuid7

RECEIPT_MAX_BYTES = 4096
SCHEMA_VERSION = 1
MAX_TIME_MS = 2**53 - 1  # JSON-safe integer range; far beyond any real clock
MAX_CALLBACK_SEQUENCE = 2**31 - 1
MAX_SIGNAL = 64
MAX_LEFTOVERS = 2**31 - 1
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,256}")

_REQUIRED = frozenset(
    {
        "schemaVersion",
        "runId",
        "attemptId",
        "callbackSequence",
        "token",
        "startedAtMs",
        "finishedAtMs",
        "exitCode",
    }
)
_ALLOWED = _REQUIRED | {"signal", "leftoversStopped"}


@dataclass(frozen=True)
class Receipt:
    run_id: str
    attempt_id: str
    callback_sequence: int
    token: str
    started_at_ms: int
    finished_at_ms: int
    exit_code: int
    signal: int | None = None
    # How many processes of the job the shim killed after its main process ended; None when
    # the revision keeps leftovers (docs/leftovers.md). A count only: no pids, no names.
    leftovers_stopped: int | None = None


def _int(obj: dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = obj[key]
    if type(value) is not int:  # bool is an int subclass and is rejected here
        raise ReceiptInvalid("NOT_INTEGER", key)
    if not lo <= value <= hi:
        raise ReceiptInvalid("OUT_OF_RANGE", key)
    return value


def _validate(obj: dict[str, Any]) -> Receipt:
    keys = set(obj)
    if keys - _ALLOWED:
        raise ReceiptInvalid("UNKNOWN_KEY")
    if _REQUIRED - keys:
        raise ReceiptInvalid("MISSING_KEY", ",".join(sorted(_REQUIRED - keys)))
    if type(obj["schemaVersion"]) is not int or obj["schemaVersion"] != SCHEMA_VERSION:
        raise ReceiptInvalid("SCHEMA_VERSION")
    for key in ("runId", "attemptId"):
        value = obj[key]
        if not isinstance(value, str) or not is_uuid7(value):
            raise ReceiptInvalid("BAD_ID", key)
    token = obj["token"]
    if not isinstance(token, str) or TOKEN_RE.fullmatch(token) is None:
        raise ReceiptInvalid("BAD_TOKEN")
    sequence = _int(obj, "callbackSequence", 1, MAX_CALLBACK_SEQUENCE)
    started = _int(obj, "startedAtMs", 0, MAX_TIME_MS)
    finished = _int(obj, "finishedAtMs", 0, MAX_TIME_MS)
    if finished < started:
        raise ReceiptInvalid("OUT_OF_RANGE", "finishedAtMs")
    exit_code = _int(obj, "exitCode", 0, 255)
    sig: int | None = None
    if "signal" in obj:
        sig = _int(obj, "signal", 1, MAX_SIGNAL)
        if exit_code != 128 + sig:
            raise ReceiptInvalid("OUT_OF_RANGE", "exitCode")
    leftovers: int | None = None
    if "leftoversStopped" in obj:
        leftovers = _int(obj, "leftoversStopped", 0, MAX_LEFTOVERS)
    return Receipt(
        run_id=obj["runId"],
        attempt_id=obj["attemptId"],
        callback_sequence=sequence,
        token=token,
        started_at_ms=started,
        finished_at_ms=finished,
        exit_code=exit_code,
        signal=sig,
        leftovers_stopped=leftovers,
    )


def _to_wire(r: Receipt) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "runId": r.run_id,
        "attemptId": r.attempt_id,
        "callbackSequence": r.callback_sequence,
        "token": r.token,
        "startedAtMs": r.started_at_ms,
        "finishedAtMs": r.finished_at_ms,
        "exitCode": r.exit_code,
    }
    if r.signal is not None:
        obj["signal"] = r.signal
    if r.leftovers_stopped is not None:
        obj["leftoversStopped"] = r.leftovers_stopped
    return obj


def encode_receipt(r: Receipt) -> bytes:
    """Canonical bytes of a valid receipt; raises :class:`ReceiptInvalid` for an invalid one."""
    obj = _to_wire(r)
    _validate(obj)
    raw = canonical_json(obj)
    if len(raw) > RECEIPT_MAX_BYTES:
        raise ReceiptInvalid("OVERSIZE")
    return raw


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ReceiptInvalid("DUPLICATE_KEY")
        obj[key] = value
    return obj


def _reject_constant(_name: str) -> Any:
    raise ReceiptInvalid("NOT_JSON", "non-finite number")


def decode_receipt(raw: bytes) -> Receipt:
    """Strictly decode receipt bytes (canonical or not); any deviation → ReceiptInvalid."""
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise ReceiptInvalid("NOT_JSON", "not bytes")
    if len(raw) > RECEIPT_MAX_BYTES:
        raise ReceiptInvalid("OVERSIZE")
    try:
        text = bytes(raw).decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise ReceiptInvalid("NOT_JSON", "invalid UTF-8") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except ReceiptInvalid:
        raise
    except (ValueError, RecursionError):
        raise ReceiptInvalid("NOT_JSON") from None
    if not isinstance(obj, dict):
        raise ReceiptInvalid("NOT_JSON", "not an object")
    return _validate(obj)
