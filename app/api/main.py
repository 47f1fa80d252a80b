"""App factories: ``serve_app`` for uvicorn in ``qinglong api`` (``create_app`` with the
process's log lines set up), ``create_app`` for everything else (tests build it directly)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app.api import (
    problems,
    retirement,
    routes_definitions,
    routes_logs,
    routes_ops,
    routes_retention,
    routes_runs,
    routes_schedules,
    routes_secrets,
    routes_token,
)
from app.api.api_docs import install_api_docs
from app.api.asgi import GuardMiddleware, RetiringClose
from app.api.head import HeadAsGet
from app.api.hot_reads import HotReads
from app.api.log_lines import log_lines
from app.api.openapi import install_openapi
from app.api.ui import SecurityHeaders, install_ui
from app.context import metrics
from app.context.bootstrap import AppContext, build_context
from app.settings import Settings

VERSION = "0.1.0"


def serve_app() -> FastAPI:
    """The app in a uvicorn worker of ``qinglong api``, whose own log lines (a run that did
    not start, the worker answering again) get a time and the role, as the worker's and the
    supervisor's do. Without it they reached stderr through logging's last-resort handler:
    the bare message, warnings only."""
    log_lines()
    if metrics.FILES_PROBLEM is not None:  # once per api process: its start is the only cause
        logging.getLogger(__name__).warning(
            "metrics: this api process keeps no observations (its metric file could not be "
            "allocated: %s); %s (docs/metrics.md)",
            metrics.FILES_PROBLEM,
            "nor does any other: there is no metrics directory"
            if metrics.NO_DIRECTORY
            else "the others' are still reported",
        )
    from app.api import startup

    return create_app(ready_line=True, on_start_failure=startup.fail)


def create_app(
    settings: Settings | None = None,
    *,
    context: AppContext | None = None,
    ready_line: bool = False,
    on_start_failure: Callable[[BaseException], NoReturn] | None = None,
    **context_overrides: Any,
) -> FastAPI:
    """Build the app. The lifespan builds (or adopts) the context and closes it on shutdown.

    ``settings`` defaults to the environment; ``context`` lets a test hand in a ready
    context (the app then owns and closes it); other keywords go to ``build_context``.
    ``on_start_failure`` gets what the lifespan's start raised (``serve_app``'s ends the
    process with one line, app/api/startup.py); without it the exception propagates.
    """
    settings = settings or (context.settings if context else Settings.from_env())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            ctx = context or build_context(settings, **context_overrides)
            app.state.context = ctx
            app.state.facade = ctx.facade
            ctx.start_background()
            retirement.arm_on_signals()  # uvicorn's handlers are installed by now
        except Exception as exc:
            if on_start_failure is None:
                raise
            on_start_failure(exc)
        if ready_line:  # serve_app's: one line per api process, once it can answer
            logging.getLogger(__name__).info("api process ready")
        try:
            yield
        finally:
            await ctx.aclose()

    app = FastAPI(
        title="qinglong-control",
        version=VERSION,
        description="Run local tasks safely and record how they ended.",
        lifespan=lifespan,
        docs_url=None,  # install_api_docs: pinned assets, checked (app/api/api_docs.py)
        redoc_url=None,
        # A path with a slash too many is 404 problem+json like any unknown path, not a 307
        # answered before authentication with a Location built from the client's Host header.
        redirect_slashes=False,
    )
    problems.install(app)
    for module in (
        routes_ops,
        routes_runs,
        routes_logs,
        routes_definitions,
        routes_secrets,
        routes_schedules,
        routes_retention,
        routes_token,
    ):
        app.include_router(module.router)
    install_ui(app)  # /ui: static files, outside the OpenAPI document (docs/ui.md)
    install_api_docs(app)
    app.add_middleware(HotReads)  # innermost: the guard and CORS still wrap it
    app.add_middleware(HeadAsGet)  # inside the guard: its stop of a stream is no error
    app.add_middleware(GuardMiddleware)
    # CORS outside the guard: its refusals (a body from a client without a valid token, a
    # header sent twice, too large a body) reach a UI of another origin as what they are,
    # not as a network error the browser made of an answer without Allow-Origin.
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "HEAD", "POST", "PUT", "DELETE"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "Idempotency-Key",
                "If-Match",  # a schedule's edit (the UI's form sends it)
                "If-None-Match",
                "Last-Event-ID",
                "Range",
            ],
            expose_headers=["ETag", "Link", "Content-Range", "X-Log-Truncated"],
        )
    app.add_middleware(RetiringClose)  # its Connection: close on CORS's own answers too
    app.add_middleware(SecurityHeaders)  # outermost: its headers are on every answer
    install_openapi(app)
    return app
