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

# In a fresh interpreter: parse the command line, then import every module the handler
# imports when it runs, found in its source and in that of the functions it names (within
# app.cli, transitively), ``_service_main``'s own imports included. A heavy import added to a
# handler later is caught too.
PROBE = textwrap.dedent(
    """
    import ast, importlib, inspect, json, sys, textwrap
    import app.cli
    from app.cli import build_parser

    def imports_of(fn, seen):
        if fn in seen:
            return []
        seen.add(fn)
        found = []
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append(node.module)
                # ``from app.api import retirement`` imports a module too ("?": it may be a name)
                found += [f"?{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Name):
                named = fn.__globals__.get(node.id)
                if inspect.isfunction(named) and named.__module__.startswith("app.cli"):
                    found += imports_of(named, seen)
        return found

    args = build_parser().parse_args(sys.argv[1].split())
    seen = set()
    for module in imports_of(app.cli._service_main, seen) + imports_of(args.handler, seen):
        try:
            importlib.import_module(module.lstrip("?"))
        except ModuleNotFoundError:
            if not module.startswith("?"):
                raise  # the handler imports a module that does not exist
    print(json.dumps(sorted(sys.modules)))
    """
)


def _loaded(argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {name.split(".")[0] for name in json.loads(done.stdout)}


@pytest.mark.parametrize(
    ("argv", "absent"),
    [
        # The worker: its own process, restarted by the supervisor after a crash.
        ("worker", WEB_STACK),
        # The supervisor: it migrates (alembic), then only starts and watches processes.
        ("serve", WEB_STACK),
        ("token list", (*WEB_STACK, "alembic")),
        ("lease show", (*WEB_STACK, "alembic")),
        ("receipts audit", (*WEB_STACK, "alembic")),
    ],
)
def test_a_service_command_loads_no_module_it_does_not_run(
    argv: str, absent: tuple[str, ...]
) -> None:
    loaded = _loaded(argv)
    assert "app" in loaded and "sqlalchemy" in loaded  # the probe did import the command's code
    assert not loaded.intersection(absent), sorted(loaded.intersection(absent))


def test_the_api_command_still_finds_the_web_stack_it_runs() -> None:
    # The other side of the lazy imports: ``qinglong api``'s handler imports them.
    assert _loaded("api").issuperset(WEB_STACK)
