"""Strict JSON request bodies: a key twice in any object is refused (422 ``DUPLICATE_KEY``).

Python's ``json`` keeps the last of two equal keys; other readers (a proxy, a WAF, a client
library) keep the first or refuse. ``{"task":"a","task":"b"}`` would then be two different
requests to two readers, so the service refuses it instead of picking one. Keys are compared
after unescaping (``"a"`` and ``"\\u0061"`` are the same key), at every depth.

One hook for every JSON route: each router uses ``StrictJSONRoute`` as its route class, which
hands FastAPI a request whose ``json()`` parses with ``object_pairs_hook``. FastAPI parses the
body exactly once, as before; only the hook runs in addition (one ``dict()`` per object).
A write route without a body (cancel, rerun, pause, a DELETE) refuses one (422): it would
be ignored. Read routes without a body keep FastAPI's own handler, behind one check of the
query: a parameter named twice is refused (422 ``VALIDATION_FAILED``), for the same reason as
a key twice in a body.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from app.api.asgi import is_json
from app.api.problems import UNSUPPORTED_MEDIA_TYPE, VALIDATION_FAILED, ApiProblem, DuplicateKey

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise DuplicateKey
    return obj


def loads_strict(raw: bytes) -> Any:
    """``json.loads`` of UTF-8 (a leading byte order mark allowed) that raises
    ``DuplicateKey`` for a repeated key in any object.

    Decoded here, never by ``json.loads`` itself: given bytes it guesses UTF-16 or UTF-32
    from the NULs, and ASCII in those encodings without a byte order mark is valid UTF-8
    (the guard's check, app/api/asgi.py), so a body another reader takes for NUL-laden UTF-8
    would have run. Decoded as UTF-8, its NULs are not JSON: ``JSONDecodeError``.
    """
    return json.loads(raw.decode("utf-8-sig"), object_pairs_hook=_unique)


_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _empty(raw: bytes) -> bool:
    """No body, blanks, or an empty JSON object (some clients send ``{}`` by default), a UTF-8
    byte order mark allowed. Linear, never parsed and never a regular expression: ``[[[...``
    would recurse, and a backtracking pattern over a megabyte of blanks ran for an hour
    before authentication (the second review)."""
    body = raw.removeprefix(b"\xef\xbb\xbf").strip()
    return not body or (body[:1] == b"{" and body[-1:] == b"}" and not body[1:-1].strip())


class _StrictRequest(Request):
    async def json(self) -> Any:
        # FastAPI calls this once per request, only for a JSON (or untyped) body.
        return loads_strict(await self.body())


def _query_names(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route reads, its dependencies' (paging) included."""
    names: set[str] = set()
    stack = [dependant]
    while stack:
        current = stack.pop()
        names.update(field.alias for field in current.query_params)
        stack.extend(current.dependencies)
    return frozenset(names)


def _repeated(request: Request, names: frozenset[str]) -> str | None:
    """The first of the route's query parameters given more than once, or None. A name the
    route does not read is ignored however often it comes, as once."""
    if not request.scope.get("query_string"):
        return None
    query = request.query_params
    if len(query) == len(query.multi_items()):  # len() counts each name once
        return None
    return next((k for k in query if k in names and len(query.getlist(k)) > 1), None)


class StrictJSONRoute(APIRoute):
    """An ``APIRoute`` whose JSON body is parsed by ``loads_strict``, and whose query names
    each parameter once: ``since=A&since=B`` is as ambiguous as a JSON key given twice (this
    framework keeps the last, other readers the first), so it is refused (422)."""

    def get_route_handler(self) -> Handler:
        handler = self._body_handler()
        names = _query_names(self.dependant)
        if not names:  # nothing to check: no wrapper on the request's path
            return handler

        async def once_each_handler(request: Request) -> Response:
            if (name := _repeated(request, names)) is not None:
                raise ApiProblem(
                    422, VALIDATION_FAILED,
                    f"the query names {name} more than once; give each parameter once",
                )  # fmt: skip
            return await handler(request)

        return once_each_handler

    def _body_handler(self) -> Handler:
        handler = super().get_route_handler()
        if self.body_field is None:
            if not (self.methods or set()) & _WRITES:
                return handler

            async def bodyless_handler(request: Request) -> Response:
                # A write that takes no body (cancel, rerun, pause, a DELETE): a body sent
                # anyway would be ignored, so ``{"priority": 9}`` on a rerun would seem to
                # change what it cannot. None, or an empty object, is taken.
                if not _empty(await request.body()):
                    raise ApiProblem(
                        422, VALIDATION_FAILED,
                        f"{request.method} {self.path} takes no body; send none",
                    )  # fmt: skip
                return await handler(request)

            return bodyless_handler

        async def strict_handler(request: Request) -> Response:
            strict = _StrictRequest(request.scope, request.receive)
            if not is_json(strict.headers.get("content-type")) and await strict.body():
                # FastAPI would validate the raw bytes as the model and answer "Input should
                # be a valid dictionary": ``curl -d`` sends a form's media type by default.
                raise ApiProblem(
                    415, UNSUPPORTED_MEDIA_TYPE,
                    "the body must be JSON, sent with Content-Type: application/json",
                )  # fmt: skip
            return await handler(strict)  # the body read above is kept for the handler

        return strict_handler
