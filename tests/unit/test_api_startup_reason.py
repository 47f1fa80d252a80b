"""The one line of an api that cannot start names the exception, never its message unless
it is an import or OS error's (app/api/start_failure.py): a message may quote a URL or a secret."""

from __future__ import annotations

import errno
import select
from multiprocessing.reduction import ForkingPickler

from uvicorn.config import STARTUP_FAILURE

from app.api.start_failure import EXIT_CANNOT_START, REASON_MAX, reason
from app.api.startup import report


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_message_that_may_quote_a_secret_is_left_out() -> None:
    said = reason(_raised(RuntimeError("cannot use postgresql://ql:hunter2@db/ql")))
    assert said.startswith("RuntimeError (at tests/unit/test_api_startup_reason.py:")
    assert "hunter2" not in said


def test_an_import_error_and_an_os_error_say_their_words() -> None:
    broken = _raised(ImportError("cannot import name 'Json' from 'psycopg.types'"))
    assert reason(broken).startswith(
        "ImportError: cannot import name 'Json' from 'psycopg.types' (at tests/unit/"
    )
    full = OSError(errno.ENOSPC, "No space left on device", "/data/logs")
    assert reason(full) == "OSError: No space left on device: /data/logs"  # never raised


def test_a_message_of_many_lines_or_of_any_length_is_one_short_line() -> None:
    # psycopg's own message when no implementation loads: three lines.
    many = ImportError(
        "no pq wrapper available.\nAttempts made:\n- couldn't import psycopg 'c' "
        "implementation: No module named 'psycopg_c'\n- couldn't import psycopg 'binary' "
        "implementation: No module named 'psycopg_binary'\n- couldn't import psycopg 'python' "
        "implementation: libpq library not found"
    )
    said = reason(_raised(many))
    assert "\n" not in said
    assert said.startswith("ImportError: no pq wrapper available. Attempts made: - couldn't")
    assert said.endswith(")")  # where it was raised, still said
    huge = OSError(errno.ENAMETOOLONG, "File name too long\n", "/d/" + "x" * 5000 + "\n/y")
    said = reason(huge)
    assert "\n" not in said
    assert len(said) <= REASON_MAX


def test_the_line_a_worker_sends_is_one_atomic_pipe_write() -> None:
    # Every worker writes to one pipe: only up to PIPE_BUF bytes are written at once.
    widest = "的" * 5000  # 3 bytes of UTF-8 each
    line = f"the api cannot start: {reason(_raised(ImportError(widest)))}"
    assert len(ForkingPickler.dumps(report(123456, line))) + 4 <= select.PIPE_BUF
    assert report(1, line) == (1, line)  # the cap alone keeps it short: nothing cut
    pid, cut = report(1, "的" * 5000)  # were it ever longer, it is cut
    assert pid == 1
    assert len(ForkingPickler.dumps((pid, cut))) + 4 <= select.PIPE_BUF


def test_the_exit_status_is_uvicorns_own_for_a_start_that_failed() -> None:
    # start_failure.py names it without importing uvicorn (the commands that never serve
    # reach it: tests/cli/test_cli_imports.py); it must stay the status uvicorn exits with.
    assert EXIT_CANNOT_START == STARTUP_FAILURE
