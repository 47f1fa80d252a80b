"""Canonical JSON, digests and UUIDv7 ids."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from app.domain.canonical import canonical_json, content_digest, recipe_id
from app.domain.ids import is_uuid7, now_ms, uuid7

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=20,
)


def test_canonical_json_sorts_keys_and_drops_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": "é", "c": None}]}) == (
        '{"a":[1,{"c":null,"d":"é"}],"b":1}'.encode()
    )


@given(st.dictionaries(st.text(), json_values))
def test_digest_does_not_depend_on_key_order(value: dict[str, object]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert content_digest(value) == content_digest(reordered)
    assert content_digest(value).startswith("sha256:")
    assert len(content_digest(value)) == len("sha256:") + 64


def test_recipe_id_is_a_content_address_over_env_and_secrets() -> None:
    rid = recipe_id({"A": "1"}, {"TOKEN": "api-token"})
    assert rid.startswith("localctx:sha256:")
    assert rid == recipe_id({"A": "1"}, {"TOKEN": "api-token"})
    assert rid != recipe_id({"A": "1"}, {"TOKEN": "other"})
    assert rid != recipe_id({"A": "1", "TOKEN": "api-token"}, {})


def test_uuid7_ids_are_version_7_and_sort_in_creation_order() -> None:
    ids = [uuid7() for _ in range(2000)]
    assert all(is_uuid7(i) for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert uuid.UUID(ids[0]).version == 7


def test_uuid7_embeds_the_current_millisecond_timestamp() -> None:
    before = now_ms()
    stamp = uuid.UUID(uuid7()).int >> 80
    after = now_ms()
    assert before <= stamp <= after


def test_is_uuid7_refuses_other_shapes() -> None:
    assert not is_uuid7(str(uuid.uuid4()))
    assert not is_uuid7("not-a-uuid")
    assert not is_uuid7(uuid7().upper())


def _reference_is_uuid7(text: str) -> bool:
    try:
        parsed = uuid.UUID(text)
    except (ValueError, TypeError, AttributeError):
        return False
    return str(parsed) == text and parsed.version == 7 and parsed.variant == uuid.RFC_4122


@given(
    st.uuids().map(str)
    | st.uuids().map(lambda u: str(u).upper())
    | st.uuids().map(lambda u: u.hex)
    | st.uuids().map(lambda u: "{" + str(u) + "}")
    | st.binary(min_size=16, max_size=16).map(lambda b: str(uuid.UUID(bytes=b)))
    | st.text(alphabet="0123456789abcdefABCDEF-{}:urn \n", max_size=45)
)
def test_is_uuid7_agrees_with_parsing_by_the_uuid_module(text: str) -> None:
    # The pattern must accept exactly what uuid.UUID parses back to the same canonical
    # lowercase text with version 7 and the RFC 4122 variant.
    assert is_uuid7(text) == _reference_is_uuid7(text)


def test_is_uuid7_accepts_only_version_7_and_the_rfc_variant() -> None:
    base = uuid7()
    assert is_uuid7(base)
    assert not is_uuid7(base[:14] + "4" + base[15:])  # version nibble
    assert not is_uuid7(base[:19] + "c" + base[20:])  # variant 110x
    assert not is_uuid7(base + "\n")
