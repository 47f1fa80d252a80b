"""The one line of an api that cannot start names the exception, never its message unless
it is an import or OS error's (app/api/startup.py): a message may quote a URL or a secret."""

from __future__ import annotations

import errno

from app.api.startup import reason


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
