"""Cursors are opaque, but a forged one carrying NUL or a lone surrogate is refused, not a 500."""

from __future__ import annotations

import base64

import pytest

from tests.api.conftest import Client, assert_problem


def _forge(kind: str, value: str) -> str:
    raw = ('{"k":"' + kind + '","v":["' + value + '"]}').encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("value", ["\\u0000", "\\ud800"])
@pytest.mark.parametrize(
    ("url", "kind"),
    [("/api/v1/runs", "runs"), ("/api/v1/tasks", "tasks"), ("/api/v1/secrets", "secrets")],
)
def test_forged_cursor_with_odd_text_is_invalid(
    client: Client, admin: dict[str, str], url: str, kind: str, value: str
) -> None:
    response = client.get(url, params={"cursor": _forge(kind, value)}, headers=admin)
    assert_problem(response, 422, "INVALID_CURSOR")


def test_forged_cursor_with_a_huge_number_is_invalid(
    client: Client, admin: dict[str, str], task: str
) -> None:
    raw = b'{"k":"revisions","v":[100000000000000000000000000000]}'
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    response = client.get("/api/v1/tasks/hello/revisions", params={"cursor": cursor}, headers=admin)
    assert_problem(response, 422, "INVALID_CURSOR")
