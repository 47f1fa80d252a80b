"""The api's log format, set once per process: ``qinglong api`` before uvicorn starts, and
each uvicorn worker (``app.api.main.serve_app``). Imports nothing of the web stack."""

from __future__ import annotations

import logging


def log_lines() -> None:
    """Time, role, level and message, as the worker's and the supervisor's lines; unless the
    process already has a handler (pytest's, a test's own)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s api %(levelname)s %(message)s")
    # The readiness check asks alembic for the schema's head, which says so at INFO each time.
    logging.getLogger("alembic").setLevel(logging.WARNING)
