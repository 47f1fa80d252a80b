"""Rolling restarts of the api drop no request (docs/rolling-restarts.md).

A real ``qinglong serve --workers 2``; four keep-alive ``http.client`` clients (no retry)
send GET run / POST run without pause while the supervisor gets SIGHUP three times.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from app.cli.serve import GRACEFUL_SHUTDOWN_S, WORKER_READY_S
from tests.e2e.conftest import ServeFactory, alive, wait_until
from tests.e2e.kit import enqueue, put_task, wait_status
from tests.e2e.load import KeepAliveLoad
from tests.e2e.test_supervisor import uvicorn_workers

pytestmark = pytest.mark.e2e

RELOADS = 3
# What the design allows one SIGHUP on a busy host: two replacements, each a new worker that
# may take WORKER_READY_S to serve and an old one that may take the graceful bound to exit,
# plus its lifespan's shutdown. 60 s was under it and failed once under the full suite.
ROLL_TIMEOUT_S = 2.0 * (WORKER_READY_S + GRACEFUL_SHUTDOWN_S + 5)


def replaced(api: int, before: dict[int, int]) -> Callable[[], bool]:
    """True once none of ``before`` lives and the manager has its two workers again."""
    return lambda: not any(alive(p, t) for p, t in before.items()) and (
        len(uvicorn_workers(api)) == 2
    )


def test_three_sighups_under_keep_alive_load_fail_no_request(
    serve_factory: ServeFactory,
) -> None:
    served = serve_factory(workers=2)
    api = served.service_pids()["api"]
    wait_until("two uvicorn workers", lambda: len(uvicorn_workers(api)) == 2, 30)
    put_task(served, "quick", "exit 0")
    run_id = enqueue(served, "quick")
    wait_status(served, run_id, {"succeeded"})
    original = uvicorn_workers(api)
    load = KeepAliveLoad(port=served.port, token=served.token, task="quick", run_id=run_id)

    seen = dict(original)
    load.start()
    try:
        for _ in range(RELOADS):
            before = uvicorn_workers(api)
            os.kill(served.pid, signal.SIGHUP)
            wait_until("every uvicorn worker replaced", replaced(api, before), ROLL_TIMEOUT_S)
            seen.update(uvicorn_workers(api))
    finally:
        result = load.stop()

    assert result.requests > 200, result
    assert not result.failures, f"{sum(result.failures.values())} of {result.requests} failed"
    assert result.reconnects > 0, "a retiring worker tells its clients Connection: close"
    assert served.service_pids()["api"] == api, "the manager stays; its workers rolled"
    assert not set(uvicorn_workers(api)) & set(original), "every uvicorn worker pid changed"
    assert len(seen) == 2 * (RELOADS + 1)
