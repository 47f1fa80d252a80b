"""``python -m app`` is the ``qinglong`` command."""

from app.cli import main

raise SystemExit(main())
