"""The words and the exit status of an api that cannot start, without the web stack.

``qinglong api`` and ``serve`` say a step before uvicorn that raised (app/cli/common.py's
``start_step``) as app/api/startup.py says a worker that could not start: one line from
``reason``, exit ``EXIT_CANNOT_START``. The commands that never serve (``worker``, ``token
list``, ...) reach this through the CLI's error handling, so it imports no uvicorn
(tests/cli/test_cli_imports.py).
"""

from __future__ import annotations

import traceback
from pathlib import Path

# The exit status of an api that cannot start: uvicorn's own for a start that failed (an
# address in use), so a unit tells it from an orderly stop (0).
EXIT_CANNOT_START = 3  # uvicorn.config.STARTUP_FAILURE (tests/unit/test_api_startup_reason.py)
# How much of an exception's words the line keeps (an import error's message, an OS error's
# words and file): a driver's message can run to many lines (psycopg's "no pq wrapper
# available" lists each implementation it tried).
WORDS_MAX = 400
REASON_MAX = 500

_APP_ROOT = Path(__file__).resolve().parents[1]


def cannot_start(exc: BaseException, what: str = "the api") -> str:
    """The one line of ``what`` that cannot start because of ``exc``."""
    return f"{what} cannot start: {reason(exc)}"


def reason(exc: BaseException) -> str:
    """``exc`` in words: its type; the message of an import error (module names) and an OS
    error's words and file; where it was raised. No other message: it may quote a URL, a
    SQL parameter or a secret."""
    what = type(exc).__name__
    if isinstance(exc, ImportError):
        what = f"{what}: {_words(str(exc))}"
    elif isinstance(exc, OSError) and exc.strerror:
        said = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
        what = f"{what}: {_words(str(said))}"
    where = _where(exc)
    return _words(f"{what} (at {where})" if where else what, REASON_MAX)


def _words(text: str, limit: int = WORDS_MAX) -> str:
    """``text`` on one line (every run of whitespace, newlines included, one space), at most
    ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _where(exc: BaseException) -> str | None:
    """The innermost frame of ``exc`` in this package, else its innermost frame at all."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    ours = [f for f in frames if Path(f.filename).is_relative_to(_APP_ROOT)]
    frame = (ours or frames)[-1]
    path = Path(frame.filename)
    shown = path.relative_to(_APP_ROOT.parent) if path.is_relative_to(_APP_ROOT.parent) else path
    return f"{shown}:{frame.lineno}"
