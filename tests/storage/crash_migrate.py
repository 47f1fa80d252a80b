"""``qinglong migrate`` that halts right after one named step, to be SIGKILLed there by a test.

``QLTEST_CRASH_AFTER``: a migration id. Once Alembic has run that step and written it to
``alembic_version`` (inside the one transaction of every step, docs/operations.md §4), the
migrating thread touches ``QLTEST_CRASH_MARK`` and blocks forever; everything else is the real
command. Run as ``python -m tests.storage.crash_migrate migrate``.
"""

from __future__ import annotations

import os
from typing import Any

from alembic.runtime.migration import HeadMaintainer

from app.cli import main
from tests.recovery.halt import halt


def _install(after: str) -> None:
    update = HeadMaintainer.update_to_step

    def update_then_halt(self: HeadMaintainer, step: Any) -> None:
        update(self, step)
        if after in self.heads:
            halt()

    HeadMaintainer.update_to_step = update_then_halt  # type: ignore[method-assign]


if __name__ == "__main__":
    _install(os.environ["QLTEST_CRASH_AFTER"])
    raise SystemExit(main())
