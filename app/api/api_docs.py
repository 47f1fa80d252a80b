"""``/docs``: Swagger UI for the OpenAPI document, its assets pinned and checked.

Swagger UI is not shipped in the package (docs/ui.md: nothing vendored); the page loads one
exact release of ``swagger-ui-dist`` from jsDelivr with Subresource Integrity, so the browser
refuses any other bytes than the ones hashed here (FastAPI's default page loads whatever
``@5`` is today, unchecked, into this origin, where a person pastes a token). The page has
its own Content-Security-Policy (``DOCS_CSP``): scripts only from that file and the page's
one inline script (by its hash), requests only to this origin, no frame around it.

To move to another release: take the files from the npm registry's tarball of that version
(``package/swagger-ui-bundle.js``, ``package/swagger-ui.css``) and write each one's
``sha384-`` + base64 digest below (``openssl dgst -sha384 -binary F | base64``).
"""

from __future__ import annotations

import base64
import hashlib
import html

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

DOCS_PATH = "/docs"
SWAGGER_UI = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5.36.0"
SWAGGER_JS = f"{SWAGGER_UI}/swagger-ui-bundle.js"
SWAGGER_JS_SRI = "sha384-fUpRgC19yPykTqzdrUbdAg8NTiu16NEKf9U12J+IJWCg8/1mEI8f2+PEIz60Wyd+"
SWAGGER_CSS = f"{SWAGGER_UI}/swagger-ui.css"
SWAGGER_CSS_SRI = "sha384-z/AtSaOHGn5MJ5auAHXUypohywlIWLBZo1jeGmhdpVIbCnFhxAH92cwdV41oyINc"

# The document's address comes from the page (a proxy's root path may prefix it), so this
# script's text, and the hash the policy allows it by, never change. No validator badge: it
# would send the document's address to validator.swagger.io.
_INIT = (
    'const spec = document.getElementById("swagger-ui").dataset.spec;'
    "window.ui = SwaggerUIBundle({url: spec, dom_id: '#swagger-ui', layout: 'BaseLayout',"
    " deepLinking: true, showExtensions: true, showCommonExtensions: true,"
    " validatorUrl: null,"
    " presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset]});"
)
_INIT_HASH = base64.b64encode(hashlib.sha256(_INIT.encode()).digest()).decode()
# No inline style either (Swagger UI sets its styles through the DOM, which the policy
# allows); images are its own data: icons. "Try it out" calls this origin only.
DOCS_CSP = (
    f"default-src 'none'; script-src {SWAGGER_JS} 'sha256-{_INIT_HASH}'; "
    f"style-src {SWAGGER_CSS}; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - API</title>
<link rel="icon" href="{root}/ui/favicon.svg">
<link rel="stylesheet" href="{css}" integrity="{css_sri}" crossorigin="anonymous">
</head>
<body>
<div id="swagger-ui" data-spec="{spec}"></div>
<script src="{js}" integrity="{js_sri}" crossorigin="anonymous"></script>
<script>{init}</script>
</body>
</html>
"""


def install_api_docs(app: FastAPI) -> None:
    """Serve the page at ``/docs`` (outside the OpenAPI document, like FastAPI's own)."""

    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = _PAGE.format(
            title=html.escape(app.title), root=html.escape(root),
            spec=html.escape(f"{root}{app.openapi_url}"), css=SWAGGER_CSS,
            css_sri=SWAGGER_CSS_SRI, js=SWAGGER_JS, js_sri=SWAGGER_JS_SRI, init=_INIT,
        )  # fmt: skip
        return HTMLResponse(page)

    app.add_route(DOCS_PATH, docs, methods=["GET", "HEAD"], include_in_schema=False)
