"""``qinglong token revoke`` ends a log follow that is open on a real ``qinglong serve``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.api.routes_logs import HEARTBEAT_S
from app.context.token_cache import DEFAULT_TTL_S
from tests.e2e.conftest import REPO_ROOT, Served, ServeFactory
from tests.e2e.kit import enqueue, put_task, wait_status
from tests.kit import web


def _ql(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=REPO_ROOT,
        env=served.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.e2e
def test_revoking_the_token_ends_its_open_follow_within_a_heartbeat(
    serve_factory: ServeFactory, tmp_path: Path
) -> None:
    served = serve_factory(stop_jobs_on_exit=True)
    made = _ql(served, "token", "create", "--scope", "logs:read", "--name", "follower")
    assert made.returncode == 0, made.stderr
    follower = {"Authorization": f"Bearer {made.stdout.strip().splitlines()[-1]}"}
    put_task(served, "long", "echo started; exec sleep 120", cwd=tmp_path)
    run_id = enqueue(served, "long")
    wait_status(served, run_id, {"running"})
    url = f"{served.base_url}/api/v1/runs/{run_id}/attempts/1/log"

    events: list[str] = []
    revoked_at = ended_at = 0.0
    with web.stream(
        "GET", url, params={"follow": "true"}, headers=follower, timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
            elif line.startswith("data: ") and events[-1] == "error":
                assert json.loads(line.removeprefix("data: "))["code"] == "UNAUTHENTICATED"
            if events == ["chunk"] and not revoked_at:  # the stream is live: revoke now
                done = _ql(served, "token", "revoke", "follower")
                assert done.returncode == 0, done.stderr
                revoked_at = time.monotonic()
        ended_at = time.monotonic()

    assert events[-1] == "error", events
    assert "end" not in events  # the job still runs: the revocation ended the stream
    assert wait_status(served, run_id, {"running"})["status"] == "running"
    assert ended_at - revoked_at < HEARTBEAT_S + DEFAULT_TTL_S
    # The same token is now refused outright.
    assert web.get(url, headers=follower).status_code == 401
