"""What a write that takes no body accepts as no body (app/api/strict_json.py ``_empty``)."""

from __future__ import annotations

import pytest

from app.api.strict_json import _empty

MIB = 1 << 20


@pytest.mark.parametrize(
    ("raw", "empty"),
    [
        (b"", True), (b" \n\t", True), (b"{}", True), (b" { \n } ", True), (b"\xef\xbb\xbf{}", True),
        (b"{}x", False), (b"x", False), (b"[]", False), (b'{"a":1}', False), (b"{ {} }", False),
        (b"[" * 200_000, False),
    ],
)  # fmt: skip
def test_no_body_blanks_or_an_empty_object_and_nothing_else(raw: bytes, empty: bool) -> None:
    assert _empty(raw) is empty


def test_a_megabyte_of_blanks_before_a_byte_is_refused_in_one_pass() -> None:
    # A backtracking pattern took about an hour on this (quadratic), on the event loop and
    # before authentication; linear work answers at once, so this test ends rather than hangs.
    assert _empty(b" " * MIB + b"x") is False
    assert _empty(b"{" + b" " * MIB + b"x}") is False
