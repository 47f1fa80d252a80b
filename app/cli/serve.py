"""``qinglong serve``: migrate, then serve the API (the supervisor joins in a later change)."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.admin import cmd_migrate, settings_for


def register(sub: Any) -> None:
    """Add ``serve`` to the parser."""
    serve = sub.add_parser("serve", help="migrate, then serve the API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1)
    serve.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the API with uvicorn."""
    import os

    import uvicorn

    cmd_migrate(args)
    settings = settings_for(args)
    os.environ["QL_DATA_DIR"] = str(settings.data_dir)
    uvicorn.run(
        "app.api.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level="warning",
    )
    return 0
