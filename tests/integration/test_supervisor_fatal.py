"""A service exit the supervisor cannot cure (a refused worker lease) stops ``serve`` non-zero.

A real supervisor process runs two real children: one exits at once with a fatal status, the
other would run for an hour. Without the fatal rule the supervisor restarts the first with
backoff forever and this test times out.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from app.context.worker_lease import EXIT_LEASE_HELD
from tests.worker.kit import ROOT

SUPERVISOR_MAIN = textwrap.dedent(
    """
    import logging, os, sys
    from app.supervisor.supervisor import ServiceSpec, Supervisor
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    code = int(sys.argv[1])
    refused = ServiceSpec(
        "worker", [sys.executable, "-c", f"raise SystemExit({code})"],
        fatal_exit_codes=frozenset({code}),
    )
    other = ServiceSpec("api", [sys.executable, "-c", "import time; time.sleep(3600)"])
    supervisor = Supervisor(services=[refused, other], env=dict(os.environ), stop_timeout_s=5)
    raise SystemExit(supervisor.run())
    """
)


def test_a_fatal_exit_stops_every_service_and_the_supervisor_exits_with_it() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SUPERVISOR_MAIN, str(EXIT_LEASE_HELD)], cwd=ROOT,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == EXIT_LEASE_HELD, done.stderr
    assert done.stderr.count("worker started") == 1, done.stderr  # never restarted
    assert "worker exited (status 75): a restart cannot help" in done.stderr
    assert "api stopped (signal SIGTERM)" in done.stderr  # stopped, not left running
    assert time.monotonic() - started < 30
