"""The halt both crash processes (``crash_worker.py``, ``crash_api.py``) stop at."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def halt() -> None:
    """Touch ``QLTEST_CRASH_MARK`` and block this thread until the test's SIGKILL."""
    Path(os.environ["QLTEST_CRASH_MARK"]).touch()
    threading.Event().wait()
