"""docs/api.md and the committed OpenAPI document describe the same operations and codes.

docs/api.md is the contract a client reads; api-schemas/openapi.json is the one a client
generates code from (test_openapi.py keeps it equal to the live app). These tests keep the
two from drifting apart, and keep every problem code the app can answer documented.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from app.domain.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "api-schemas" / "openapi.json"
API_DOC = ROOT / "docs" / "api.md"
PROBLEMS = ROOT / "app" / "api" / "problems.py"
_OPERATION = re.compile(r"`(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (/[^`\s?]*)`")
_CODE = re.compile(r"^[A-Z][A-Z0-9_]{3,}$")


def _documented_operations() -> set[tuple[str, str]]:
    return set(_OPERATION.findall(API_DOC.read_text(encoding="utf-8")))


def _openapi_operations() -> set[tuple[str, str]]:
    doc = json.loads(OPENAPI.read_text(encoding="utf-8"))
    return {(method.upper(), path) for path, item in doc["paths"].items() for method in item}


def _http_layer_codes() -> set[str]:
    """Every UPPER_SNAKE string literal of app/api/problems.py: the codes it can answer."""
    tree = ast.parse(PROBLEMS.read_text(encoding="utf-8"))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _CODE.match(node.value)
    }


def _documented_codes() -> set[str]:
    return set(re.findall(r"`([A-Z][A-Z0-9_]{3,})`", API_DOC.read_text(encoding="utf-8")))


def test_every_openapi_operation_is_in_the_api_doc() -> None:
    missing = _openapi_operations() - _documented_operations()
    assert not missing, f"docs/api.md does not describe: {sorted(missing)}"


def test_every_operation_the_api_doc_lists_is_in_the_openapi_document() -> None:
    extra = _documented_operations() - _openapi_operations()
    assert not extra, f"docs/api.md lists operations the app does not serve: {sorted(extra)}"


def test_the_http_layer_codes_are_found_where_they_are_defined() -> None:
    # A guard for the scan below: if problems.py moved its codes, the scan would find none.
    assert {"UNAUTHENTICATED", "FORBIDDEN", "NOT_READY", "INTERNAL_ERROR"} <= _http_layer_codes()


def test_every_problem_code_the_app_can_answer_is_in_the_api_doc() -> None:
    codes = {code.value for code in ErrorCode} | _http_layer_codes()
    missing = codes - _documented_codes()
    assert not missing, f"docs/api.md §2 does not list: {sorted(missing)}"
