"""Schemathesis against the ASGI app: no 5xx, responses match the document, errors are problems.

Bounded (``max_examples`` per operation) so the whole module stays well under a minute.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api.main import create_app
from app.domain.profiles import EDGE
from app.domain.tokens import new_api_token
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.tokens_repo import TokenRepository

MAX_EXAMPLES = 25


def errors_are_problem_json(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx is RFC 9457 problem+json with a code."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    assert content_type.startswith("application/problem+json"), content_type
    body = response.json()
    assert {"type", "title", "status", "detail", "code"} <= set(body), body
    assert body["status"] == response.status_code
    return True


# Built at import (collection) without I/O: the data dir is created by the fixture below.
# (``schemathesis.pytest.from_fixture`` does not work with pytest 9.2's nodes.)
_ROOT = Path(tempfile.gettempdir()) / f"ql-fuzz-{os.getpid()}-{uuid.uuid4().hex[:8]}"
_SETTINGS = Settings(data_dir=_ROOT, database_url=f"sqlite:///{_ROOT / 'q.db'}", profile=EDGE)
_APP = create_app(_SETTINGS, execution=False)
schema = schemathesis.openapi.from_dict(_APP.openapi())
schema.app = _APP
# Both modes: inputs that fit the document and inputs that break it (bad input ≠ 500).
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


@pytest.fixture(scope="module")
def admin_token() -> Iterator[str]:
    """A migrated SQLite data dir with a task and an admin token; removed afterwards."""
    _SETTINGS.ensure_data_dir()
    engine = make_engine(_SETTINGS.database_url)
    try:
        upgrade_to_head(engine)
        token = new_api_token()
        TokenRepository(engine).create(name="fuzz", scopes=frozenset({"admin"}), token=token)
        DefinitionRepository(engine).put_revision(
            task="hello", revision=1, executor="local_process", argv=["/bin/true"],
            cwd=None, recipe=None, timeout_seconds=None, priority=0,
        )  # fmt: skip
    finally:
        engine.dispose()
    try:
        yield token
    finally:
        # Schemathesis keeps an app's lifespan running for the process; end ours now.
        from schemathesis.python import asgi

        asgi.shutdown_lifespans()
        shutil.rmtree(_ROOT, ignore_errors=True)


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
def test_api_conforms_and_never_fails_on_input(case: Any, admin_token: str) -> None:
    token = admin_token
    case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"},
        checks=[
            not_a_server_error,
            response_schema_conformance,
            content_type_conformance,
            status_code_conformance,
            errors_are_problem_json,
        ],
    )
