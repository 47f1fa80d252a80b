"""A ``qinglong`` sub-command loads only what it runs (app/cli/common.py).

The parser imports every sub-command module, so a heavy import at a module's top is paid by
every command: before, ``qinglong worker`` and ``qinglong serve`` (the supervisor) loaded
the api's web stack and ``token list`` loaded alembic, about 0.6 s of CPU a start on a
two-core host (a worker's restart after a crash waited for it). Each check runs in a fresh
interpreter, since this pytest process has loaded everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

WEB_STACK = ("fastapi", "starlette", "uvicorn", "prometheus_client")

PROBE = textwrap.dedent(
    """
    import importlib, json, sys
    from app.cli import build_parser
    args = build_parser().parse_args(sys.argv[1].split())
    for module in sys.argv[2].split():  # what the handler imports when it runs
        importlib.import_module(module)
    print(json.dumps(sorted(sys.modules)))
    """
)


def _loaded(argv: str, *handler_modules: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, argv, " ".join(handler_modules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {name.split(".")[0] for name in json.loads(done.stdout)}


@pytest.mark.parametrize(
    ("argv", "handler_modules", "absent"),
    [
        # The worker: its own process, restarted by the supervisor after a crash.
        (
            "worker",
            ("app.context.worker_process", "app.worker.server", "app.context.worker_lease"),
            WEB_STACK,
        ),
        # The supervisor: it migrates (alembic), then only starts and watches processes.
        (
            "serve",
            ("app.supervisor.supervisor", "app.supervisor.stop_jobs", "app.storage.migrate"),
            WEB_STACK,
        ),
        ("token list", ("app.storage.tokens_repo",), (*WEB_STACK, "alembic")),
        ("lease show", ("app.storage.lease_repo",), (*WEB_STACK, "alembic")),
        ("receipts audit", ("app.storage.journal_repo",), (*WEB_STACK, "alembic")),
    ],
)
def test_a_service_command_loads_no_module_it_does_not_run(
    argv: str, handler_modules: tuple[str, ...], absent: tuple[str, ...]
) -> None:
    loaded = _loaded(argv, *handler_modules)
    assert "app" in loaded and "sqlalchemy" in loaded  # the probe did import the command's code
    assert not loaded.intersection(absent), sorted(loaded.intersection(absent))


def test_the_api_command_still_finds_the_web_stack_it_runs() -> None:
    # The other side of the lazy imports: ``qinglong api`` imports them in its handler.
    loaded = _loaded("api", "app.api.retirement", "app.context.metrics", "app.api.main")
    assert loaded.issuperset(WEB_STACK)
