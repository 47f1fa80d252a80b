"""No failure after secrets are resolved writes a secret anywhere the service keeps or says.

A real ``qinglong serve`` (SQLite and PostgreSQL) with the real SecretRepository and key file
drives one run into each ending that can happen once step 4 (docs/design.md §3.4) resolved its
secrets: a run that waits on a real full tmpfs and runs once space returns, an invalid environment value (a stored
secret with a NUL), a failed launch (argv[0] does not exist), a timeout and a cancel. Then
every table and column, every event and attempt the API shows, every file of the data dir
(the SQLite database and its WAL included) and the service's own log are searched for each
plaintext. The cancelled job prints a digest of its secret, so the secrets did reach the job.
Each engine runs twice: jobs as the service's own user, and (root only) as ``QL_JOB_USER=nobody``
(docs/job-user.md), whose jobs start in ``/`` since they cannot enter pytest's private tmp dir.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.secret_crypto import KeyRing
from app.storage.secrets_repo import SecretRepository
from tests.e2e.conftest import Served, ServeFactory, wait_until
from tests.e2e.kit import enqueue, events, get_run, put_task, read_log, wait_status
from tests.execution.kit import all_database_text
from tests.jobuser import job_user_or_skip
from tests.kit import web

TMPFS_MIB = 60  # edge profile: 4 MiB quota + 32 MiB reserve fit; a filler makes them not


@dataclass
class Stack:
    served: Served
    db_url: str
    logs: Path
    job_user: str | None


@pytest.fixture(params=[None, "nobody"], ids=["same-user", "job-user"])
def stack(
    request: pytest.FixtureRequest, db_url: str, serve_factory: ServeFactory, tmp_path: Path
) -> Iterator[Stack]:
    """``qinglong serve`` (edge profile) whose logs dir is a private 60 MiB tmpfs."""
    job_user = None if request.param is None else job_user_or_skip()
    env = {"QL_PROFILE": "edge"} | ({"QL_JOB_USER": job_user} if job_user else {})
    data_dir = tmp_path / "data"
    logs = data_dir / "logs"
    logs.mkdir(parents=True, mode=0o700)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m,mode=0700", "tmpfs", str(logs)],
        check=True,
    )
    served = None
    try:
        served = serve_factory(
            data_dir=data_dir, database_url=db_url, extra_env=env
        )
        yield Stack(served, db_url, logs, job_user)
    finally:
        if served is not None:
            served.stop()
        subprocess.run(["umount", str(logs)], check=True)


def _get(served: Served, path: str) -> Any:
    r = web.get(f"{served.base_url}{path}", headers=served.auth, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _fill(logs: Path, leave_bytes: int) -> Path:
    filler = logs / "filler"
    st = os.statvfs(logs)
    size = st.f_bavail * st.f_frsize - leave_bytes
    with filler.open("wb") as fh:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            size -= fh.write(chunk[: min(len(chunk), size)])
    return filler


def _all_files(root: Path) -> Iterator[tuple[Path, bytes]]:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_file() and path.name != "filler":
                yield path, path.read_bytes()


@pytest.mark.e2e
def test_no_secret_leaks_on_any_failure_after_secrets_are_resolved(
    stack: Stack, tmp_path: Path
) -> None:
    served, base, auth = stack.served, stack.served.base_url, stack.served.auth
    cwd = tmp_path if stack.job_user is None else None  # the job user cannot enter tmp_path
    good = "plain-" + secrets.token_hex(16)
    bad = "badval-" + secrets.token_hex(16)
    r = web.put(f"{base}/api/v1/secrets/good", json={"value": good}, headers=auth)
    assert r.status_code == 204, r.text
    # The API refuses a NUL; a value stored by the real repository (an older, looser rule, a
    # restored backup) is refused at step 5 instead.
    settings = Settings.from_env({"QL_DATA_DIR": str(served.data_dir)})
    engine = make_engine(stack.db_url)
    try:
        ring = KeyRing.from_settings(secret_key=None, key_file=settings.key_file)
        SecretRepository(engine, ring).put(name="bad", value=bad + "\0")
    finally:
        engine.dispose()

    def recipe(secret: str) -> str:
        body = {"env": {"PLAIN": "x"}, "secrets": {"S": secret}}
        r = web.post(f"{base}/api/v1/recipes", json=body, headers=auth)
        assert r.status_code in (200, 201), r.text
        return str(r.json()["id"])

    with_good, with_bad = recipe("good"), recipe("bad")
    put_task(served, "disk", "true", cwd=cwd, recipe=with_good)
    put_task(served, "badenv", "true", cwd=cwd, recipe=with_bad)
    put_task(served, "slow", "exec sleep 60", cwd=cwd, recipe=with_good, timeout_seconds=1)
    put_task(
        served, "cancel", 'printf %s "$S" | sha256sum; exec sleep 60', cwd=cwd,
        recipe=with_good,
    )  # fmt: skip
    missing = f"/nonexistent/ql-{secrets.token_hex(4)}"
    r = web.put(
        f"{base}/api/v1/tasks/noexec/revisions/1",
        json={"argv": [missing], "cwd": str(cwd or "/"), "recipe": with_good},
        headers=auth,
    )
    assert r.status_code == 201, r.text

    filler = _fill(stack.logs, leave_bytes=8 << 20)  # below the 36 MiB the edge profile needs
    try:
        # On a full disk the run waits, queued and untouched, and starts once space returns.
        disk = enqueue(served, "disk")
        said = "queued runs wait"
        wait_until("the api's line that runs wait for space", lambda: said in served.log(), 20)
        assert get_run(served, disk)["status"] == "queued"
        assert [e["type"] for e in events(served, disk)] == ["run.queued"]
    finally:
        filler.unlink()
    ends = {disk: ("succeeded", None)}
    badenv = enqueue(served, "badenv")
    ends[badenv] = ("failed", "INVALID_ENV_VALUE")
    noexec = enqueue(served, "noexec")
    ends[noexec] = ("failed", "EXECUTOR_START_FAILED")
    slow = enqueue(served, "slow")
    ends[slow] = ("timed_out", None)
    cancel = enqueue(served, "cancel")
    ends[cancel] = ("cancelled", None)
    digest = hashlib.sha256(good.encode()).hexdigest().encode()
    wait_status(served, cancel, {"running"})
    wait_until("the job's digest line", lambda: digest in read_log(served, cancel), 20)
    r = web.post(f"{base}/api/v1/runs/{cancel}/cancel", headers=auth)
    assert r.status_code == 202, r.text

    said: list[str] = []
    endings = {}
    for run_id in ends:
        run = wait_status(served, run_id, {"succeeded", "failed", "cancelled", "timed_out", "lost"})
        endings[run_id] = (run["status"], run["latest_attempt"]["error_code"])
        said.append(repr(run))
        said.append(repr(events(served, run_id)))
        said.append(repr(_get(served, f"/api/v1/runs/{run_id}/attempts")))

    engine = make_engine(stack.db_url)
    try:
        stored = all_database_text(engine)
    finally:
        engine.dispose()
    said.append(served.log())  # the supervisor's, the api's and the worker's own lines
    for plaintext in (good, bad):
        assert plaintext not in stored, "a secret in the database"
        assert plaintext not in "\n".join(said), "a secret in an answer, event or log line"
        for path, content in _all_files(served.data_dir):
            assert plaintext.encode() not in content, f"a secret in {path}"
    # Each run ended the way this test meant (checked after the scans, which must pass first).
    assert endings == ends
    # A launch that failed says why in codes: the program is not there. Never its path.
    (ending,) = [e["data"] for e in events(served, noexec) if e["type"] == "attempt.failed"]
    assert (ending["start_failure"], ending["errno"]) == ("EXEC_FAILED", "ENOENT"), ending
    assert missing not in "\n".join(said)  # runs, events, attempts, the service log
    # The api's own line for it: its time, its role, the codes.
    (line,) = [x for x in served.log().splitlines() if f"run {noexec} " in x and "did not start" in x]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} api WARNING run \S+ attempt \S+ did not start: "
        r"start_failed EXECUTOR_START_FAILED EXEC_FAILED",
        line,
    ), line
    api_lines = [x for x in served.log().splitlines() if " api " in x]
    assert any(x.endswith(" api INFO api process ready") for x in api_lines), api_lines
    assert not [x for x in api_lines if "Context impl" in x or "non-transactional DDL" in x]
    assert any(digest in content for _, content in _all_files(stack.logs))  # it did reach the job
