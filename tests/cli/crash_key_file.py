"""``qinglong`` halted while it publishes a new key file, to be SIGKILLed there by a test.

``QLTEST_CRASH_AT``: ``before_link`` (the temp file holds the whole new key, fsynced, and is
not linked to ``secret.key`` yet) or ``after_link`` (linked, its temp name not removed yet:
a second name of the live key). At that point the publishing thread touches
``QLTEST_CRASH_MARK`` and blocks forever; everything else is the real command (its own
``make_first_start_files``, ``app/storage/secret_crypto.py``'s ``_load_or_create``). Run as
``python -m tests.cli.crash_key_file api ...``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from app.cli import main
from tests.recovery.halt import halt

KEY_FILE = "secret.key"


def _install(point: str) -> None:
    if point not in ("before_link", "after_link"):
        raise SystemExit(f"unknown crash point {point!r}")
    link = os.link

    def link_around(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        publishing = Path(dst).name == KEY_FILE
        if publishing and point == "before_link":
            halt()
        link(src, dst, *args, **kwargs)
        if publishing and point == "after_link":
            halt()

    os.link = link_around


if __name__ == "__main__":
    _install(os.environ["QLTEST_CRASH_AT"])
    raise SystemExit(main())
