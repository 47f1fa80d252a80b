"""What a service's ``before_stop`` begins is waited for in the supervisor's loop.

``serve --stop-jobs-on-exit`` asks the running worker to stop and record the jobs before it
stops the worker. A real supervisor process runs two real children; the wait ends when the
test says it is done, or a second SIGTERM kills at once: signals are never held up by it
(review: a blocking hook held a second SIGTERM 8.5 s).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from tests.integration.kit import poll_until
from tests.worker.kit import ROOT

SUPERVISOR_MAIN = textwrap.dedent(
    """
    import logging, os, sys, time
    from pathlib import Path
    from app.supervisor.supervisor import ServiceSpec, Supervisor
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    here = Path(sys.argv[1])
    wait_s = float(sys.argv[2])

    class Wait:
        deadline = time.monotonic() + wait_s
        def done(self):
            return (here / "done").exists()
        def close(self, *, finished):
            (here / "closed").write_text(f"finished={finished}")

    def before_stop(pid):
        (here / "began").write_text(str(pid))
        return Wait()

    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
    # The worker exits 75 (another worker holds the lease) once the test says so.
    refusing = [sys.executable, "-c", (
        "import os, sys, time\\n"
        f"while not os.path.exists({str(here / 'refuse')!r}): time.sleep(0.02)\\n"
        "sys.exit(75)"
    )]
    api = ServiceSpec("api", sleeper)
    worker = ServiceSpec(
        "worker", refusing, before_stop=before_stop, fatal_exit_codes=frozenset({75})
    )
    supervisor = Supervisor(services=[api, worker], env=dict(os.environ), stop_timeout_s=5)
    raise SystemExit(supervisor.run())
    """
)


@contextlib.contextmanager
def _stopping(tmp_path: Path, wait_s: float = 3600) -> Iterator[subprocess.Popen[str]]:
    """A supervisor whose two services started, told to stop (SIGTERM): its wait for the
    worker's ``before_stop`` has begun. Killed by its pid if the test left it running."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR_MAIN, str(tmp_path), str(wait_s)], cwd=ROOT,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while sum("started (pid" in line for line in lines) < 2:
            line = proc.stderr.readline()
            assert line, lines
            lines.append(line)
        proc.send_signal(signal.SIGTERM)
        poll_until(lambda: (tmp_path / "began").exists())
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()  # its services get PDEATHSIG
            proc.communicate()


def _stderr_to_the_end(proc: subprocess.Popen[str]) -> str:
    _, err = proc.communicate(timeout=30)
    return err


def test_the_worker_is_stopped_only_once_what_before_stop_began_is_done(tmp_path: Path) -> None:
    with _stopping(tmp_path) as proc:
        time.sleep(0.5)  # a few of the loop's looks: it must still wait
        assert proc.poll() is None and not (tmp_path / "closed").exists()
        (tmp_path / "done").touch()
        err = _stderr_to_the_end(proc)
    assert proc.returncode == 0, err
    assert (tmp_path / "closed").read_text() == "finished=True"
    assert err.index("stopping api") < err.index("stopping worker")
    assert "worker stopped (signal SIGTERM)" in err


def test_a_second_sigterm_during_the_wait_kills_at_once(tmp_path: Path) -> None:
    with _stopping(tmp_path) as proc:
        again = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        err = _stderr_to_the_end(proc)
        took = time.monotonic() - again
    assert "SIGTERM again: killing the services now" in err
    assert (tmp_path / "closed").read_text() == "finished=False"
    assert took < 10, took  # not the wait's hour, nor a stop timeout per service


def test_past_its_deadline_the_wait_ends_and_the_worker_is_stopped(tmp_path: Path) -> None:
    with _stopping(tmp_path, wait_s=1.0) as proc:
        err = _stderr_to_the_end(proc)
    assert proc.returncode == 0, err
    assert (tmp_path / "closed").read_text() == "finished=False"
    assert "worker stopped (signal SIGTERM)" in err


def test_a_worker_refused_during_the_wait_ends_it_and_is_serves_exit_status(
    tmp_path: Path,
) -> None:
    """A refusal (another worker holds the lease) while stopping is still what serve exits
    with, so the stop of the jobs after the services does not run for it (review)."""
    with _stopping(tmp_path) as proc:
        (tmp_path / "refuse").touch()  # the worker exits 75 during the wait
        err = _stderr_to_the_end(proc)
    assert proc.returncode == 75, err
    assert (tmp_path / "closed").read_text() == "finished=False"
    assert "worker exited (status 75)" in err
