"""The system browser for the UI tests (docs/ui.md §4): Debian's ``chromium`` driven by
Playwright for Python, never a browser that Playwright downloads.

``browser_or_skip`` skips with a visible reason when ``/usr/bin/chromium`` (or
``QL_TEST_BROWSER``) or the ``playwright`` package is missing, unless
``QL_TEST_BROWSER_REQUIRED=1`` (set by ``.ci/run``, which installs the package) makes that a
failure.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

BROWSER_ENV = "QL_TEST_BROWSER"
REQUIRED_ENV = "QL_TEST_BROWSER_REQUIRED"
DEFAULT_BROWSER = "/usr/bin/chromium"


def browser_or_skip() -> str:
    """The chromium executable, or skip (fail when QL_TEST_BROWSER_REQUIRED=1)."""
    path = os.environ.get(BROWSER_ENV) or DEFAULT_BROWSER
    reason = None
    if importlib.util.find_spec("playwright") is None:
        reason = "the browser tests need the playwright package (the test extra)"
    elif not Path(path).is_file() or not os.access(path, os.X_OK):
        reason = f"the browser tests need {path} (apt-get install chromium; .ci/run does it)"
    if reason is None:
        return path
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1 but {reason}")
    pytest.skip(reason)


# ASCII words a zh-CN label may carry as they are: a command, a scope name, a setting, units.
# Any other Latin word on a zh-CN page is an untranslated label (tests/unit/test_ui_static.py
# holds the dictionary to this list, tests/e2e/test_ui_browser.py the rendered pages).
ZH_AS_IS_WORDS = frozenset({
    "HTTP", "QL_CORS_ORIGINS", "UTC", "admin", "qinglong", "token", "create", "bootstrap",
    "bin", "sh", "bash", "QL",  # /bin/sh, /bin/bash and the reserved QL3_ prefix
    "B", "KiB", "MiB", "GiB", "TiB",
})  # fmt: skip
