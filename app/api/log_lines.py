"""The api's log format, set once per process: ``qinglong api`` before uvicorn starts, and
each uvicorn worker (``app.api.main.serve_app``). Imports nothing of the web stack."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

# uvicorn's warning for each request it cannot parse (app/api/retirement.py answers it 400):
# on a host a port scanner reaches, one line per request would fill the journal.
INVALID_REQUEST = "Invalid HTTP request received."
INVALID_REQUEST_LOG_EVERY_S = 10.0


class OncePer(logging.Filter):
    """Lets uvicorn's ``INVALID_REQUEST`` warning through at most once per ``every_s`` (each
    process its own), saying so as the api's 503 line does; every other record passes."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._every_s, self._clock = every_s, clock
        self._last = -math.inf
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != INVALID_REQUEST:
            return True
        with self._lock:
            now = self._clock()
            if now - self._last < self._every_s:
                return False
            self._last = now
        record.msg = f"{INVALID_REQUEST} (one such line per {self._every_s:.0f} s at most)"
        record.args = ()
        return True


def log_lines() -> None:
    """Time, role, level and message, as the worker's and the supervisor's lines; unless the
    process already has a handler (pytest's, a test's own). uvicorn's own lines go there
    too (``cmd_api`` gives it no handler of its own)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s api %(levelname)s %(message)s")
    # The readiness check asks alembic for the schema's head, which says so at INFO each time.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, OncePer) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(OncePer(INVALID_REQUEST_LOG_EVERY_S))
