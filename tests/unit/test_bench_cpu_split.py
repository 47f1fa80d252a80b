"""bench/cpu_split.py: which process a /proc entry is counted as, and the /proc reading."""

from __future__ import annotations

import os

from bench.cpu_split import _processes, _role


def test_roles_of_the_stack_processes() -> None:
    assert _role(os.getpid(), "anything") == "bench client"
    api = "/v/bin/python -m uvicorn app.api.main:create_app --factory --host 127.0.0.1"
    assert _role(2, api) == "api"
    assert _role(3, "/v/bin/python -m app worker") == "worker"
    assert _role(4, "/v/bin/python -I -S /r/app/worker/shim.py --zygote") == "zygote"
    assert _role(5, "postgres: 15/main: postgres test 127.0.0.1(5012) idle") == "database"
    # Anything else (another uvicorn app, a shell) is not counted as part of the stack.
    assert _role(6, "/v/bin/python -m uvicorn other:app") is None
    assert _role(7, "/bin/sh -c true") is None


def test_reads_this_process_cpu_from_proc() -> None:
    own, children, cmdline = _processes()[os.getpid()]
    assert own > 0  # this interpreter has run for far more than one clock tick
    assert children >= 0
    assert "python" in cmdline or "pytest" in cmdline
