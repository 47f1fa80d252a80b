"""Malformed HTTP framing gets problem+json from a real uvicorn, over raw sockets.

Each protocol of app/api/framing.py runs in a real ``uvicorn`` process on 127.0.0.1 serving the
real app; each request is bytes no HTTP client would send. Whatever refuses it (the parser or
the app's guard), the answer is problem+json and the connection then closes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from app.worker.identity import stat_fields
from tests.e2e.conftest import REPO_ROOT, free_port, wait_until
from tests.kit import web
from tests.worker.kit import kill_exact

# The protocols `qinglong api` runs (app/api/retirement.py): httptools by default, h11 beside.
HTTPTOOLS = "app.api.retirement:RetiringHttpToolsProtocol"
H11 = "app.api.retirement:RetiringH11Protocol"

POST = b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\n"
CASES = {
    "path of 70k characters": b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "Content-Length: abc": POST + b"Content-Length: abc\r\n\r\n",
    "negative Content-Length": POST + b"Content-Length: -1\r\n\r\n",
    "two Content-Lengths": POST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "Content-Length with chunked": (
        POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "a broken chunk": POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
    # httptools takes it as chunked and ignored the gzip; h11 refuses it (one answer for both).
    "a transfer coding besides chunked": (
        POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
    ),
    "a header name with a space": b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n",
    "not HTTP at all": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
}
# The 70k path is over the head cap under either parser (docs/http-limits.md).
EXPECTED = {
    (HTTPTOOLS, "path of 70k characters"): (431, "HEADERS_TOO_LARGE"),
    (H11, "path of 70k characters"): (431, "HEADERS_TOO_LARGE"),
}


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers, body, closed) of one response read from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    try:
        closed = sock.recv(1) == b""
    except TimeoutError:
        closed = False
    return status, headers, body, closed


@pytest.fixture(scope="module", params=[HTTPTOOLS, H11])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    """A real uvicorn process serving the app with one of the problem+json protocols."""
    protocol: str = request.param
    data_dir = tmp_path_factory.mktemp("framing") / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env["QL_DATA_DIR"] = str(data_dir)
    migrated = subprocess.run(
        [sys.executable, "-m", "app", "migrate"], env=env, cwd=REPO_ROOT, capture_output=True
    )
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "--factory", "app.api.main:create_app"]
    argv += ["--http", protocol, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--log-level", "warning"]
    log = (data_dir / "uvicorn.log").open("wb")
    proc = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=log, stderr=log)
    fields = stat_fields(proc.pid)
    ticks = int(fields[19]) if fields else 0
    try:

        def up() -> bool:
            assert proc.poll() is None, (data_dir / "uvicorn.log").read_text()
            try:
                return web.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until("uvicorn", up, 30)
        yield protocol, port
    finally:
        if proc.poll() is None:
            kill_exact(proc.pid, ticks)
        proc.wait(timeout=10)
        log.close()


@pytest.mark.e2e
@pytest.mark.parametrize("case", list(CASES))
def test_malformed_framing_is_answered_with_problem_json(
    server: tuple[str, int], case: str
) -> None:
    protocol, port = server
    want_status, want_code = EXPECTED.get((protocol, case), (400, "MALFORMED_REQUEST"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(CASES[case])
        status, headers, body, closed = _answer(sock)
    assert status == want_status, body
    assert headers["content-type"] == "application/problem+json"
    problem = json.loads(body)
    assert problem["code"] == want_code
    assert problem["status"] == want_status
    assert {"type", "title", "detail"} <= set(problem)
    if want_status in (400, 431):
        assert closed  # a request whose framing is in doubt ends its connection
    # The process is unharmed.
    assert web.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
