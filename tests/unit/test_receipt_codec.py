"""Strict completion-receipt codec: canonical encode, strict decode, stable reasons."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.canonical import canonical_json
from app.domain.errors import ReceiptInvalid
from app.domain.ids import uuid7
from app.domain.receipt import RECEIPT_MAX_BYTES, Receipt, decode_receipt, encode_receipt

RUN = "01890a5d-ac96-774b-bcce-b302099a8057"
ATTEMPT = "01890a5d-ac96-7f4b-8cce-b302099a8058"
TOKEN = "tok_abcdefghijklmnop-XYZ0123"


def _receipt(**over: Any) -> Receipt:
    base = Receipt(
        run_id=RUN,
        attempt_id=ATTEMPT,
        callback_sequence=1,
        token=TOKEN,
        started_at_ms=1_700_000_000_000,
        finished_at_ms=1_700_000_000_500,
        exit_code=0,
    )
    return replace(base, **over)


def _wire(**over: Any) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(encode_receipt(_receipt()))
    obj.update(over)
    return obj


def _reason(raw: bytes) -> str:
    with pytest.raises(ReceiptInvalid) as info:
        decode_receipt(raw)
    return info.value.reason


def test_encode_is_canonical_and_round_trips() -> None:
    r = _receipt(exit_code=137, signal=9)
    raw = encode_receipt(r)
    assert raw == canonical_json(json.loads(raw))
    assert raw.startswith(b'{"attemptId":')
    assert b" " not in raw
    assert decode_receipt(raw) == r


def test_signal_absent_when_not_killed() -> None:
    assert b"signal" not in encode_receipt(_receipt())
    assert decode_receipt(encode_receipt(_receipt())).signal is None


def test_leftovers_count_is_optional_and_round_trips() -> None:
    assert b"leftoversStopped" not in encode_receipt(_receipt())
    assert decode_receipt(encode_receipt(_receipt())).leftovers_stopped is None
    counted = _receipt(leftovers_stopped=2)
    assert b'"leftoversStopped":2' in encode_receipt(counted)
    assert decode_receipt(encode_receipt(counted)) == counted


def test_shim_style_bytes_decode() -> None:
    # Same bytes the shim writes: json.dumps(sort_keys, compact separators).
    obj = _wire(exitCode=7)
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    assert decode_receipt(raw).exit_code == 7


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"x" * (RECEIPT_MAX_BYTES + 1), "OVERSIZE"),
        (b"\xff\xfe{}", "NOT_JSON"),
        (b"{", "NOT_JSON"),
        (b"[]", "NOT_JSON"),
        (b"null", "NOT_JSON"),
        (b"", "NOT_JSON"),
    ],
)
def test_malformed_bytes(raw: bytes, reason: str) -> None:
    assert _reason(raw) == reason


def test_oversize_is_checked_before_parsing() -> None:
    obj = _wire()
    raw = json.dumps(obj).encode() + b" " * RECEIPT_MAX_BYTES
    assert _reason(raw) == "OVERSIZE"


def test_exactly_max_bytes_with_whitespace_is_accepted() -> None:
    raw = encode_receipt(_receipt())
    padded = raw + b" " * (RECEIPT_MAX_BYTES - len(raw))
    assert len(padded) == RECEIPT_MAX_BYTES
    assert decode_receipt(padded) == _receipt()


def test_duplicate_key_rejected_even_with_same_value() -> None:
    raw = encode_receipt(_receipt())
    dup = raw[:-1] + b',"exitCode":0}'
    assert _reason(dup) == "DUPLICATE_KEY"


def test_nested_duplicate_key_rejected() -> None:
    raw = encode_receipt(_receipt())
    assert _reason(raw[:-1] + b',"x":{"a":1,"a":2}}') == "DUPLICATE_KEY"


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"extra": 1}, "UNKNOWN_KEY"),
        ({"schemaVersion": 2}, "SCHEMA_VERSION"),
        ({"schemaVersion": True}, "SCHEMA_VERSION"),
        ({"schemaVersion": "1"}, "SCHEMA_VERSION"),
        ({"runId": "not-a-uuid"}, "BAD_ID"),
        ({"runId": "01890a5d-ac96-474b-bcce-b302099a8057"}, "BAD_ID"),  # v4
        ({"attemptId": ATTEMPT.upper()}, "BAD_ID"),
        ({"attemptId": 7}, "BAD_ID"),
        ({"token": "short"}, "BAD_TOKEN"),
        ({"token": "x" * 257}, "BAD_TOKEN"),
        ({"token": "has space in the token"}, "BAD_TOKEN"),
        ({"token": "tok\u00e9abcdefghijklmnop"}, "BAD_TOKEN"),
        ({"token": 1234567890123456}, "BAD_TOKEN"),
        ({"callbackSequence": 0}, "OUT_OF_RANGE"),
        ({"callbackSequence": True}, "NOT_INTEGER"),
        ({"callbackSequence": 1.0}, "NOT_INTEGER"),
        ({"startedAtMs": -1}, "OUT_OF_RANGE"),
        ({"startedAtMs": "1"}, "NOT_INTEGER"),
        ({"finishedAtMs": 1_699_999_999_999}, "OUT_OF_RANGE"),
        ({"finishedAtMs": None}, "NOT_INTEGER"),
        ({"exitCode": 256}, "OUT_OF_RANGE"),
        ({"exitCode": -1}, "OUT_OF_RANGE"),
        ({"exitCode": False}, "NOT_INTEGER"),
        ({"exitCode": 137, "signal": 0}, "OUT_OF_RANGE"),
        ({"exitCode": 193, "signal": 65}, "OUT_OF_RANGE"),
        ({"exitCode": 1, "signal": 9}, "OUT_OF_RANGE"),
        ({"exitCode": 137, "signal": True}, "NOT_INTEGER"),
        ({"exitCode": 137, "signal": None}, "NOT_INTEGER"),
        ({"leftoversStopped": -1}, "OUT_OF_RANGE"),
        ({"leftoversStopped": 2**31}, "OUT_OF_RANGE"),
        ({"leftoversStopped": True}, "NOT_INTEGER"),
        ({"leftoversStopped": None}, "NOT_INTEGER"),
        ({"leftoversStopped": 2.0}, "NOT_INTEGER"),
    ],
)
def test_field_violations(over: dict[str, Any], reason: str) -> None:
    assert _reason(json.dumps(_wire(**over)).encode()) == reason


@pytest.mark.parametrize(
    "key",
    ["schemaVersion", "runId", "attemptId", "callbackSequence", "token", "startedAtMs",
     "finishedAtMs", "exitCode"],
)
def test_missing_key(key: str) -> None:
    obj = _wire()
    del obj[key]
    assert _reason(json.dumps(obj).encode()) == "MISSING_KEY"


def test_non_finite_numbers_rejected() -> None:
    raw = encode_receipt(_receipt()).replace(b'"exitCode":0', b'"exitCode":NaN')
    assert b"NaN" in raw
    assert _reason(raw) == "NOT_JSON"


def test_message_never_contains_content() -> None:
    secret = "SECRETSECRETSECRET123"
    for over in ({"token": secret + " "}, {"runId": secret}, {secret: 1}):
        with pytest.raises(ReceiptInvalid) as info:
            decode_receipt(json.dumps(_wire(**over)).encode())
        assert secret not in str(info.value)
        assert secret not in repr(info.value.args)


def test_encode_rejects_invalid_receipt() -> None:
    with pytest.raises(ReceiptInvalid) as info:
        encode_receipt(_receipt(exit_code=1, signal=9))
    assert info.value.reason == "OUT_OF_RANGE"
    with pytest.raises(ReceiptInvalid):
        encode_receipt(_receipt(token="bad"))


def test_reason_is_a_value_error() -> None:
    assert issubclass(ReceiptInvalid, ValueError)


# ---- property tests -------------------------------------------------------------------

_tokens = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-",
    min_size=16,
    max_size=256,
)
_ids = st.integers(min_value=0, max_value=2**48 - 1).map(lambda ms: uuid7(ms))


@st.composite
def receipts(draw: st.DrawFn) -> Receipt:
    started = draw(st.integers(min_value=0, max_value=2**53 - 1))
    finished = draw(st.integers(min_value=started, max_value=2**53 - 1))
    sig = draw(st.none() | st.integers(min_value=1, max_value=64))
    exit_code = 128 + sig if sig is not None else draw(st.integers(0, 255))
    return Receipt(
        run_id=draw(_ids),
        attempt_id=draw(_ids),
        callback_sequence=draw(st.integers(min_value=1, max_value=2**31 - 1)),
        token=draw(_tokens),
        started_at_ms=started,
        finished_at_ms=finished,
        exit_code=exit_code,
        signal=sig,
        leftovers_stopped=draw(st.none() | st.integers(min_value=0, max_value=2**31 - 1)),
    )


@settings(max_examples=200, deadline=None)
@given(receipts())
def test_property_round_trip(r: Receipt) -> None:
    raw = encode_receipt(r)
    assert len(raw) <= RECEIPT_MAX_BYTES
    assert decode_receipt(raw) == r
    assert encode_receipt(decode_receipt(raw)) == raw


_wrong_values = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(receipts(), st.data())
def test_property_type_mutation_rejected(r: Receipt, data: st.DataObject) -> None:
    obj = json.loads(encode_receipt(r))
    key = data.draw(st.sampled_from(sorted(obj)))
    value = data.draw(_wrong_values)
    if isinstance(obj[key], str) and isinstance(value, str):
        value = value + " "  # never a valid id or token: the space is outside the alphabet
    obj[key] = value
    with pytest.raises(ReceiptInvalid):
        decode_receipt(json.dumps(obj).encode())


@settings(max_examples=200, deadline=None)
@given(receipts(), st.data())
def test_property_key_mutation_rejected(r: Receipt, data: st.DataObject) -> None:
    obj = json.loads(encode_receipt(r))
    action = data.draw(st.sampled_from(["drop", "add", "rename", "duplicate"]))
    key = data.draw(st.sampled_from(sorted(obj)))
    if action == "drop":
        if key == "signal":
            obj["signal"] = obj.pop("signal") + 1  # also invalid: exitCode != 128 + signal
            if obj["signal"] > 64:
                obj["signal"] = 1
        elif key == "leftoversStopped":
            obj[key] = -1  # dropping it is valid (it is optional): break it instead
        else:
            del obj[key]
        raw = json.dumps(obj).encode()
    elif action == "add":
        extra = data.draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in obj))
        obj[extra] = data.draw(st.integers())
        raw = json.dumps(obj).encode()
    elif action == "rename":
        new = key + data.draw(st.text(min_size=1, max_size=3))
        obj[new] = obj.pop(key)
        raw = json.dumps(obj).encode()
    else:
        raw = json.dumps(obj).encode()[:-1] + b"," + json.dumps({key: obj[key]}).encode()[1:]
    with pytest.raises(ReceiptInvalid):
        decode_receipt(raw)


# ---- the published JSON Schema agrees with the codec ------------------------------------

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "api-schemas" / "completion-receipt.schema.json"


def test_schema_examples_decode() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    every = _receipt(exit_code=137, signal=9, leftovers_stopped=0)
    assert set(schema["properties"]) == set(json.loads(encode_receipt(every)))
    for example in schema["examples"]:
        decode_receipt(canonical_json(example))


@settings(max_examples=100, deadline=None)
@given(receipts())
def test_property_encoded_receipts_satisfy_the_schema(r: Receipt) -> None:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    validator = jsonschema_rs.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    assert validator.is_valid(json.loads(encode_receipt(r)))
