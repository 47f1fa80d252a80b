"""App factory for uvicorn (``app.api.main:create_app``)."""

from __future__ import annotations

from fastapi import FastAPI


def create_app() -> FastAPI:
    """Build the FastAPI application."""
    app = FastAPI(title="qinglong-control", version="0.1.0")

    @app.get("/healthz", operation_id="healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
