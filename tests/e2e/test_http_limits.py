"""HTTP limits before authentication, over raw sockets against a real ``qinglong api``.

Each test runs against ``qinglong api`` on 127.0.0.1 with either parser (``QL_HTTP_PARSER``)
and short timeouts from the environment, so the settings travel the way an operator's do
(docs/http-limits.md). Every socket is closed and the api process ended by its pid.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from app.worker.identity import stat_fields
from tests.e2e.conftest import REPO_ROOT, _create_admin_token, free_port, wait_until
from tests.kit import web
from tests.worker.kit import kill_exact

HEADER_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 2.0
SLOWLORIS = 300


@dataclass
class Api:
    pid: int
    port: int
    token: str

    def rss_kib(self) -> int:
        """VmRSS of the api process (with one worker, uvicorn serves in this very process)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def healthz_s(self) -> float:
        """Seconds one ``GET /healthz`` on a fresh connection took (it must answer 200)."""
        started = time.monotonic()
        r = web.get(f"http://127.0.0.1:{self.port}/healthz", timeout=5)
        assert r.status_code == 200
        return time.monotonic() - started


def _start_api(tmp: Path, parser: str, **env_extra: str) -> tuple[Api, Callable[[], None]]:
    data_dir = tmp / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_DATA_DIR": str(data_dir), "QL_HTTP_PARSER": parser, **env_extra}
    token = _create_admin_token(Settings.from_env(env))  # migrates too
    port = free_port()
    argv = [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", str(port)]
    log = (tmp / "api.log").open("wb")
    proc = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=log, stderr=log)
    fields = stat_fields(proc.pid)
    ticks = int(fields[19]) if fields else 0

    def stop() -> None:
        if proc.poll() is None:
            kill_exact(proc.pid, ticks)
        proc.wait(timeout=10)
        log.close()

    def up() -> bool:
        assert proc.poll() is None, (tmp / "api.log").read_text()
        try:
            return web.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("qinglong api", up, 30)
    except BaseException:
        stop()
        raise
    return Api(proc.pid, port, token), stop


@pytest.fixture(scope="module", params=["httptools", "h11"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """``qinglong api`` with short head and body timeouts and room for the slowloris test."""
    served, stop = _start_api(
        tmp_path_factory.mktemp("limits"),
        request.param,
        QL_HTTP_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        QL_HTTP_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
    )
    try:
        yield served
    finally:
        stop()


@pytest.fixture(autouse=True, scope="module")
def _room_for_sockets() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * SLOWLORIS
    if soft < wanted and (hard == resource.RLIM_INFINITY or hard >= wanted):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _server_connections(api: Api) -> list[tuple[str, int]]:
    """(TCP state, bytes not yet read) of each connection the api process holds on its port,
    from ``/proc``: what the server has accepted and read, seen without asking it."""
    inodes = set()
    for fd in Path(f"/proc/{api.pid}/fd").iterdir():
        with suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    held = []
    for line in Path(f"/proc/{api.pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        state, unread, inode = fields[3], int(fields[4].split(":")[1], 16), fields[9]
        if local_port == api.port and inode in inodes and state != "0A":  # 0A: the listener
            held.append((state, unread))
    return held


def _until_server_holds(api: Api, count: int) -> None:
    """Wait until the api holds exactly ``count`` connections and has read all they sent (so
    what it did with them has happened), instead of sleeping an amount a loaded host may
    exceed."""

    def settled() -> bool:
        held = _server_connections(api)
        return len(held) == count and all(unread == 0 for _, unread in held)

    wait_until(f"the api to hold {count} connections, all read", settled, 10)


def _send_all(sock: socket.socket, data: bytes) -> None:
    """Send what the server takes; a server that stopped reading resets the connection."""
    view = memoryview(data)
    try:
        for start in range(0, len(view), 1 << 20):
            sock.sendall(view[start : start + (1 << 20)])
    except (BrokenPipeError, ConnectionResetError):
        pass


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the one answer before the server closed ``sock``."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), data[:200]
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _kept_alive_answer(sock: socket.socket) -> int:
    """Status of one answer read to its Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1])


def _problem(sock: socket.socket, status: int, code: str) -> None:
    got, headers, body = _answer(sock)
    assert got == status, body
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    assert json.loads(body)["code"] == code


@pytest.mark.e2e
def test_a_64_mib_header_gets_431_quickly_and_the_api_memory_stays_flat(api: Api) -> None:
    before = api.rss_kib()
    started = time.monotonic()
    with api.connect() as sock:
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 20) + b"\r\n\r\n"
        _send_all(sock, head)
        _problem(sock, 431, "HEADERS_TOO_LARGE")  # and then the server closed
    assert time.monotonic() - started < 5
    grown_mib = (api.rss_kib() - before) / 1024
    assert grown_mib < 16, f"the api grew by {grown_mib:.0f} MiB"
    assert api.healthz_s() < 1


@pytest.mark.e2e
def test_a_4_mib_header_on_an_authenticated_route_gets_431_not_200(api: Api) -> None:
    request = b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    request += b"Authorization: Bearer " + api.token.encode() + b"\r\n"
    with api.connect() as sock:  # the token is good: a small request is answered
        sock.sendall(request + b"\r\n")
        assert _answer(sock)[0] == 200
    with api.connect() as sock:
        _send_all(sock, request + b"X-Big: " + b"a" * (4 << 20) + b"\r\n\r\n")
        _problem(sock, 431, "HEADERS_TOO_LARGE")


@pytest.mark.e2e
def test_300_slowloris_connections_each_end_at_the_header_timeout_while_healthz_answers(
    api: Api,
) -> None:
    before = api.rss_kib()
    with ExitStack() as stack:
        opened: dict[socket.socket, float] = {}
        closed: dict[socket.socket, float] = {}
        for _ in range(SLOWLORIS):
            sock = stack.enter_context(api.connect())
            opened[sock] = time.monotonic()
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        peak_kib = api.rss_kib()
        selector = stack.enter_context(selectors.DefaultSelector())
        for sock in opened:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        slowest = 0.0
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 10
        while len(closed) < SLOWLORIS and time.monotonic() < deadline:
            for sock in opened.keys() - closed.keys():  # a byte more, never the end of a head
                with suppress(OSError):
                    sock.send(b"X")
            if time.monotonic() - min(opened.values()) < HEADER_TIMEOUT_S - 0.5:
                slowest = max(slowest, api.healthz_s())
            for key, _ in selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                data = b""
                try:
                    while chunk := sock.recv(65536):
                        data += chunk
                except BlockingIOError:
                    continue  # the answer came; the close follows
                except ConnectionResetError:
                    pass
                selector.unregister(sock)
                closed[sock] = time.monotonic()
                assert not data or data.startswith(b"HTTP/1.1 408 "), data[:100]
        assert len(closed) == SLOWLORIS, f"{SLOWLORIS - len(closed)} still open"
        lifetimes = [closed[s] - opened[s] for s in opened]
        assert min(lifetimes) > HEADER_TIMEOUT_S - 0.5
        assert max(lifetimes) < HEADER_TIMEOUT_S + 5
        assert 0 < slowest < 1, f"healthz took {slowest:.2f} s beside the slowloris connections"
        grown_mib = (max(peak_kib, api.rss_kib()) - before) / 1024
        assert grown_mib < 16, f"{SLOWLORIS} slow connections grew the api by {grown_mib:.0f} MiB"


@pytest.mark.e2e
def test_a_body_shorter_than_its_content_length_is_ended_after_the_body_timeout(
    api: Api,
) -> None:
    with api.connect() as sock:
        sock.sendall(
            b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + api.token.encode() + b"\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"task": "'
        )
        started = time.monotonic()
        _problem(sock, 408, "REQUEST_TIMEOUT")
        waited = time.monotonic() - started
    assert BODY_TIMEOUT_S - 0.5 < waited < BODY_TIMEOUT_S + 5


@pytest.mark.e2e
def test_a_coded_body_is_refused_415_at_once_unread(api: Api) -> None:
    # The head alone decides: the body is never read (nor awaited until the body timeout,
    # as the 408 above is), the connection closes after the answer.
    with api.connect() as sock:
        sock.sendall(
            b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + api.token.encode() + b"\r\n"
            b"Content-Encoding: gzip\r\nContent-Length: 100000\r\n\r\n" + b"\x1f\x8b"
        )
        sock.settimeout(BODY_TIMEOUT_S - 0.5)  # before: the body was awaited, then 408
        status, headers, body = _answer(sock)
    assert status == 415, body
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    assert headers["accept-encoding"] == "identity"
    assert json.loads(body)["code"] == "UNSUPPORTED_MEDIA_TYPE"


@pytest.mark.e2e
@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_connections_beyond_the_bound_close_an_idle_one_or_get_503_and_the_api_serves(
    parser: str, tmp_path: Path
) -> None:
    bound = 20
    served, stop = _start_api(tmp_path, parser, QL_HTTP_MAX_CONNECTIONS=str(bound))
    with ExitStack() as stack:
        stack.callback(stop)
        # The bound full of idle keep-alive connections: a new client gets in, the oldest
        # idle one is closed (all within uvicorn's 5 s keep-alive timeout).
        idle = [stack.enter_context(served.connect()) for _ in range(bound)]
        for sock in idle:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _kept_alive_answer(sock) == 200
        assert served.healthz_s() < 1
        idle[0].settimeout(3)
        assert idle[0].recv(1) == b""
        idle[1].settimeout(0.2)
        with pytest.raises(TimeoutError):
            idle[1].recv(1)
        for sock in idle:
            sock.close()
        _until_server_holds(served, 0)
        # The bound full of slow heads: a new client still gets in, the oldest head is closed.
        slow = [stack.enter_context(served.connect()) for _ in range(bound)]
        for sock in slow:  # their order of age is the order they connected in
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        _until_server_holds(served, bound)
        assert served.healthz_s() < 1
        slow[0].settimeout(5)
        assert slow[0].recv(1) == b""
        for sock in slow[1:3]:
            sock.settimeout(0.2)
            with pytest.raises(TimeoutError):
                sock.recv(1)
        for sock in slow:
            sock.close()
        _until_server_holds(served, 0)
        # The bound full of requests in progress (bodies still owed, with a valid token: a
        # body without one is refused unread): the new one gets 503.
        busy = [stack.enter_context(served.connect()) for _ in range(bound)]
        owed = (
            b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n"
            b"Authorization: Bearer " + served.token.encode() + b"\r\n\r\n{"
        )
        for sock in busy:
            sock.sendall(owed)
        _until_server_holds(served, bound)
        with served.connect() as sock:
            _problem(sock, 503, "TOO_MANY_CONNECTIONS")
        for sock in busy:
            sock.close()
        _until_server_holds(served, 0)
        assert served.healthz_s() < 1


_UPGRADE = (
    b"Host: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


@pytest.mark.e2e
@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_websocket_upgrades_are_answered_as_http_and_never_keep_a_place_in_the_bound(
    parser: str, tmp_path: Path
) -> None:
    # Before: uvicorn handed each upgrade to its WebSocket protocol, the app refused it with
    # a plain-text 403, and the connection left the HTTP protocol without its
    # connection_lost: it kept its place in the bound for good. `bound` such requests, with
    # no token, locked every client out of the api process (503 TOO_MANY_CONNECTIONS) until
    # a restart.
    bound = 5
    served, stop = _start_api(tmp_path, parser, QL_HTTP_MAX_CONNECTIONS=str(bound))
    with ExitStack() as stack:
        stack.callback(stop)
        answers = []
        for _ in range(2 * bound):
            with served.connect() as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\n" + _UPGRADE + b"\r\n")
                answers.append(_answer_then_close(sock))
        _until_server_holds(served, 0)
        assert served.healthz_s() < 1  # before: 503 TOO_MANY_CONNECTIONS, for good
        for status, _, body in answers:
            assert (status, json.loads(body)) == (200, {"status": "ok"}), body
        with served.connect() as sock:  # an api route: the app's own problem+json, not 403
            sock.sendall(b"GET /api/v1/runs HTTP/1.1\r\n" + _UPGRADE + b"\r\n")
            status, headers, body = _answer_then_close(sock)
        assert status == 401, body
        assert headers["content-type"] == "application/problem+json"
        assert json.loads(body)["code"] == "UNAUTHENTICATED"
        _until_server_holds(served, 0)
        assert served.healthz_s() < 1
        # uvicorn runs with ws="none": its WebSocket module, and the websockets library with
        # its C extension, were never imported (before: mapped in every api process).
        maps = Path(f"/proc/{served.pid}/maps").read_text()
        assert "/websockets/" not in maps and "/wsproto/" not in maps
    assert b"Unsupported upgrade" not in (tmp_path / "api.log").read_bytes()


def _answer_then_close(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The first answer on ``sock`` (read to its Content-Length); the client closes after it."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return int(lines[0].split()[1]), headers, body


@pytest.mark.e2e
@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_a_body_without_a_valid_token_is_refused_unread_and_never_holds_a_place_in_the_bound(
    parser: str, tmp_path: Path
) -> None:
    # Before: the guard read every body before the route authenticated, so a client with no
    # token that trickled bodies (a byte just inside each stall timeout, 1 MiB each) held
    # `bound` requests in progress for as long as it liked, and every other client got 503.
    bound = 5
    served, stop = _start_api(tmp_path, parser, QL_HTTP_MAX_CONNECTIONS=str(bound))
    heads = {
        "no token": b"",
        "unknown token": b"Authorization: Bearer ql_" + b"A" * 43 + b"\r\n",
        "two tokens": (b"Authorization: Bearer " + served.token.encode() + b"\r\n") * 2,
        "chunked": b"Transfer-Encoding: chunked\r\n",
    }
    with ExitStack() as stack:
        stack.callback(stop)
        for name, extra in heads.items():
            owed = [stack.enter_context(served.connect()) for _ in range(bound)]
            framing = b"" if b"chunked" in extra else b"Content-Length: 1000\r\n"
            for sock in owed:
                sock.sendall(
                    b"PUT /api/v1/secrets/s HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\n" + framing + extra + b"\r\n"
                    + (b"5\r\n" if not framing else b"") + b'{"val'
                )
            for sock in owed:
                sock.settimeout(5)
                status, headers, body = _answer(sock)  # at once, then closed
                assert status == 401, (name, body)
                assert headers["content-type"] == "application/problem+json"
                assert headers["connection"] == "close"
                assert headers["www-authenticate"] == "Bearer"
                assert json.loads(body)["code"] == "UNAUTHENTICATED"
            for sock in owed:
                sock.close()
            assert served.healthz_s() < 1, name
        r = web.put(
            f"http://127.0.0.1:{served.port}/api/v1/secrets/s", json={"value": "v"},
            headers={"Authorization": f"Bearer {served.token}"}, timeout=10,
        )  # fmt: skip
        assert r.status_code == 204, r.text  # with its token, a body is read as before
