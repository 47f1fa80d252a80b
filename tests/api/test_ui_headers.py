"""The UI at /ui (docs/ui.md): served from the package with a strict CSP, and every answer of
the app carries nosniff and a Referrer-Policy; QL_CORS_ORIGINS still works beside it."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import anyio
import httpx
import pytest

from app.api import retirement
from app.api.api_docs import (
    DOCS_CSP,
    SWAGGER_CSS,
    SWAGGER_CSS_SRI,
    SWAGGER_JS,
    SWAGGER_JS_SRI,
    SWAGGER_UI,
)
from app.api.main import create_app
from app.api.ui import CONTENT_SECURITY_POLICY
from app.settings import Settings
from tests.api.conftest import Client, MakeToken


@pytest.fixture
def db_url(sqlite_template: Path, tmp_path: Path) -> str:
    """SQLite only: headers do not depend on the database (this overrides the PG variant)."""
    path = tmp_path / "qinglong.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


def test_ui_files_carry_a_strict_csp_and_no_sniffing(client: Client) -> None:
    assert client.get("/ui").status_code == 308
    assert client.get("/ui").headers["location"] == "/ui/"
    # The root, the address a person opens first, leads there too (not remembered: 307).
    root = client.get("/", headers={"Host": "elsewhere.example"})
    assert (root.status_code, root.headers["location"]) == (307, "/ui/")
    for path, media in (
        ("/ui/", "text/html"),
        ("/ui/js/main.js", "javascript"),
        ("/ui/app.css", "text/css"),
        ("/ui/i18n/zh-CN.json", "application/json"),
    ):
        r = client.get(path)
        assert r.status_code == 200, path
        assert media in r.headers["content-type"], (path, r.headers["content-type"])
        csp = r.headers["content-security-policy"]
        assert csp == CONTENT_SECURITY_POLICY
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["x-frame-options"] == "DENY"
    # Nothing outside the static folder is reachable through it.
    assert client.get("/ui/%2e%2e/%2e%2e/settings.py").status_code == 404
    assert client.get("/ui/no-such-file.js").status_code == 404
    assert not [p for p in client.get("/openapi.json").json()["paths"] if p.startswith("/ui")]


def test_api_docs_load_one_pinned_swagger_release_checked_under_their_own_csp(
    client: Client,
) -> None:
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    csp = r.headers["content-security-policy"]
    assert csp == DOCS_CSP
    assert r.headers["x-frame-options"] == "DENY"
    # Every script and stylesheet: the pinned release's file, with its digest to check.
    assert re.findall(r"<(?:script|link)[^>]* (?:src|href)=\"https://[^>]*>", page) == [
        f'<link rel="stylesheet" href="{SWAGGER_CSS}" integrity="{SWAGGER_CSS_SRI}" '
        'crossorigin="anonymous">',
        f'<script src="{SWAGGER_JS}" integrity="{SWAGGER_JS_SRI}" crossorigin="anonymous">',
    ]
    assert re.fullmatch(r"https://cdn\.jsdelivr\.net/npm/swagger-ui-dist@\d+\.\d+\.\d+", SWAGGER_UI)
    # The one inline script is the one the policy allows by its hash; nothing else inline.
    inline = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(inline) == 1
    digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
    script_src = next(d for d in csp.split("; ") if d.startswith("script-src "))
    assert script_src == f"script-src {SWAGGER_JS} 'sha256-{digest}'"
    assert "unsafe" not in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert 'data-spec="/openapi.json"' in page and "validatorUrl: null" in page
    assert client.get("/openapi.json").status_code == 200


def test_api_answers_carry_nosniff_and_cors_still_works(
    settings: Settings, make_token: MakeToken, monkeypatch: pytest.MonkeyPatch
) -> None:
    origin = "http://panel.example"
    client = Client(create_app(replace(settings, cors_origins=(origin,)), execution=False))
    try:
        denied = client.get("/api/v1/runs")
        assert denied.status_code == 401
        assert denied.headers["x-content-type-options"] == "nosniff"
        assert denied.headers["referrer-policy"] == "no-referrer"
        assert "content-security-policy" not in denied.headers  # JSON answers: no page
        preflight = client.request(
            "OPTIONS",
            "/api/v1/runs",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == origin
        # Every header the UI sends: a schedule's edit (If-Match) and its creation.
        for sent in ("if-match", "if-none-match", "idempotency-key", "last-event-id"):
            conditional = client.request("OPTIONS", "/api/v1/schedules/nightly", headers={
                "Origin": origin, "Access-Control-Request-Method": "PUT",
                "Access-Control-Request-Headers": f"authorization,content-type,{sent}",
            })  # fmt: skip
            assert conditional.status_code == 200, (sent, conditional.text)
        token = {"Authorization": f"Bearer {make_token('runs:read')}", "Origin": origin}
        listed = client.get("/api/v1/runs", headers=token)
        assert listed.status_code == 200
        assert listed.headers["access-control-allow-origin"] == origin
        assert listed.headers["x-content-type-options"] == "nosniff"
        # The guard's refusals too (a body without a valid token, a header sent twice): a
        # UI of another origin must read the 401 and sign in again, not meet a network error.
        stale = {"Authorization": "Bearer ql_" + "A" * 43, "Origin": origin}
        refused = client.post("/api/v1/runs", json={"task": "t"}, headers=stale)
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == origin
        twice = [*token.items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
        doubled = client.post("/api/v1/runs", json={"task": "t"}, headers=twice)
        assert doubled.status_code == 400
        assert doubled.headers["access-control-allow-origin"] == origin
        # A retiring process closes every connection after its answer, CORS's own preflight
        # answers too (CORS sits outside the guard), so the browser's next request goes to
        # a process that serves.
        retired = threading.Event()
        retired.set()
        monkeypatch.setattr(retirement, "_retiring", retired)  # as begin() would, undone after
        closing = client.request("OPTIONS", "/api/v1/runs", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
        })  # fmt: skip
        assert closing.status_code == 200 and closing.headers["connection"] == "close"
        assert client.get("/api/v1/runs", headers=token).headers["connection"] == "close"
    finally:
        client.close()


def test_below_a_root_path_the_ui_and_the_docs_keep_their_policies(settings: Settings) -> None:
    # Behind a proxy's prefix (uvicorn --root-path) the path in the scope keeps the prefix:
    # matched without it, as the routes are (the review of the /docs change found both bare).
    transport = httpx.ASGITransport(app=create_app(settings, execution=False), root_path="/q")

    async def get(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            return await http.get(path)

    docs = anyio.run(get, "/q/docs")
    assert docs.status_code == 200 and docs.headers["content-security-policy"] == DOCS_CSP
    assert 'data-spec="/q/openapi.json"' in docs.text and 'href="/q/ui/favicon.svg"' in docs.text
    ui = anyio.run(get, "/q/ui/")
    assert ui.status_code == 200
    assert ui.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert ui.headers["x-frame-options"] == "DENY"
    # Stripped as the router strips it: "/p/" makes "/p//ui/" the UI; a root that is a
    # prefix of a path but not a segment of it strips nothing.
    slashed = httpx.ASGITransport(app=create_app(settings, execution=False), root_path="/p/")

    async def get_slashed(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=slashed, base_url="http://t") as http:
            return await http.get(path)

    for path, policy in (("/p//ui/", CONTENT_SECURITY_POLICY), ("/p//docs", DOCS_CSP)):
        answer = anyio.run(get_slashed, path)
        assert answer.status_code == 200, path
        assert answer.headers["content-security-policy"] == policy, path
    for root in ("/d", "/do", "/"):
        bare = httpx.ASGITransport(app=create_app(settings, execution=False), root_path=root)

        async def get_docs(transport: httpx.ASGITransport = bare) -> httpx.Response:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                return await http.get("/docs")

        docs = anyio.run(get_docs)
        assert docs.status_code != 200 or docs.headers["content-security-policy"] == DOCS_CSP
