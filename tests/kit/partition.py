"""A network partition that drops packets, with no reset: what a host cut off sees.

A relay cut (tests/kit/relay.py) closes connections, so the client hears at once. A real
partition (a dead route, a host that lost power, a firewall dropping packets) says nothing:
what the client sends is never acknowledged and nothing comes back. This builds one.

``partitioned(url)`` gives ``url`` rewritten to reach its PostgreSQL server through a relay
listening inside a network namespace of its own, joined to this one by a veth pair:

    client (here) --veth--> relay's listener (the namespace) --> server (here, unchanged)

``Partition.drop()`` adds a blackhole route in the namespace for this side's address, and
the namespace filters by reverse path: every answer to the client vanishes, and so does
every packet the client sends (a SYN, a statement, a keepalive probe, a reset), none of them
refused. ``heal()`` removes it. The namespace is held by a ``sleep`` the kit starts and
kills by its pid (and which dies with the test process); the veth pair is deleted with it.
Nothing outlives the context.

``vanished_session(url, options)`` is the other side of it: a PostgreSQL session whose
client socket is then destroyed without a word (``TCP_REPAIR``: no FIN, no reset), as when
the client's host lost power; the server's side of it stays until the server probes.

Building and removing a partition adds and removes an interface and an address here, and
Chromium abandons the page loads in flight when the host's network changes
(``ERR_NETWORK_CHANGED``): the browser test's pages then never draw. So a partition holds a
shared lock on this file while it exists, and ``network_unchanged()``, which the browser
test holds, takes it exclusive: the two never overlap, across xdist's processes too.

Needs root, ``ip``, ``unshare``, ``nsenter`` and ``setpriv`` (iproute2, util-linux) and
veth. Where one is missing the test is skipped with the reason, unless ``QL_TEST_NETNS_REQUIRED=1`` (set by
``.ci/run``, which installs iproute2) makes that a failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import itertools
import os
import random
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import make_url

from tests.kit.relay import Relay

REQUIRED_ENV = "QL_TEST_NETNS_REQUIRED"
_CLONE_NEWNET = 0x40000000
_TCP_REPAIR = 19  # linux/tcp.h
_NETWORK = ipaddress.ip_network("10.213.0.0/16")  # /30s of it, one per partition
_serial = itertools.count()


@contextlib.contextmanager
def _network_lock(mode: int) -> Iterator[None]:
    with open(__file__, "rb") as this:  # a file every checkout has: nothing left behind
        fcntl.flock(this, mode)  # released when the file closes
        yield


@contextlib.contextmanager
def network_unchanged() -> Iterator[None]:
    """While held, no partition exists or is built, in any test process of this host."""
    with _network_lock(fcntl.LOCK_EX):
        yield


class Partition:
    """A veth pair into a network namespace of its own, and the blackhole that cuts it."""

    def __init__(self) -> None:
        self._changes = contextlib.ExitStack()  # the shared lock, from open to close
        self._holder: subprocess.Popen[bytes] | None = None
        self._link: str | None = None
        self._listeners: list[socket.socket] = []
        n = next(_serial)
        tag = f"{os.getpid() % 100000}x{n % 100}"  # at most 15 characters with its prefix
        self._names = (f"qlp{tag}a", f"qlp{tag}b")
        self.here, self.there, self._prefix = "", "", 30

    def open(self) -> None:
        self._changes.enter_context(_network_lock(fcntl.LOCK_SH))
        # The holder dies with this process even if the test run is killed (its parent-death
        # signal, set by setpriv before the exec: no Python runs in the forked child).
        holder = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "unshare", "--net", "sleep", "3600"]
        )
        self._holder = holder
        own = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{holder.pid}/ns/net") == own:  # until unshare is done
            if holder.poll() is not None or time.monotonic() > deadline:
                raise OSError("unshare --net did not make a network namespace")
            time.sleep(0.005)
        here, there = self._names
        _ip("link", "add", here, "type", "veth", "peer", "name", there, "netns", str(holder.pid))
        self._link = here
        subnet = _free_subnet()
        self.here, self.there = (str(a) for a in subnet.hosts())
        self._prefix = subnet.prefixlen
        _ip("addr", "add", f"{self.here}/{self._prefix}", "dev", here)
        _ip("link", "set", here, "up")
        self._inside("ip", "addr", "add", f"{self.there}/{self._prefix}", "dev", there)
        self._inside("ip", "link", "set", there, "up")
        # Strict reverse-path filtering inside: once the route back to this side is a
        # blackhole, what this side sends is dropped on arrival too.
        for conf in ("all", there):  # /proc/sys/net is the writer's namespace's (no procps)
            self._inside("sh", "-c", f"echo 1 > /proc/sys/net/ipv4/conf/{conf}/rp_filter")

    def listener(self) -> socket.socket:
        """A listening socket inside the namespace, on its end of the pair."""
        made: list[socket.socket] = []
        failed: list[BaseException] = []

        def make() -> None:  # setns moves this thread only, which then ends
            try:
                fd = os.open(f"/proc/{self._pid()}/ns/net", os.O_RDONLY)
                try:
                    if _libc().setns(fd, _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns into the namespace")
                finally:
                    os.close(fd)
                made.append(socket.create_server((self.there, 0)))
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=make)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]
        self._listeners.append(made[0])
        return made[0]

    def drop(self) -> None:
        """From now on no packet passes between the two sides, either way, and none is
        refused: a silent partition."""
        self._inside("ip", "route", "add", "blackhole", f"{self.here}/32")

    def heal(self) -> None:
        self._inside("ip", "route", "del", "blackhole", f"{self.here}/32")

    def close(self) -> None:
        for sock in self._listeners:
            sock.close()
        try:
            if self._link is not None:
                with contextlib.suppress(subprocess.SubprocessError):
                    _ip("link", "del", self._link)
        finally:
            try:
                if self._holder is not None:
                    self._holder.kill()  # by its pid; the namespace goes with its last user
                    self._holder.wait(5)
            finally:
                self._changes.close()

    def _pid(self) -> int:
        assert self._holder is not None
        return self._holder.pid

    def _inside(self, *argv: str) -> None:
        _run("nsenter", f"--net=/proc/{self._pid()}/ns/net", *argv)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of the test network that no address of this namespace is in yet."""
    taken = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "to", str(_NETWORK)],
        capture_output=True, text=True, timeout=10, check=True,
    ).stdout  # fmt: skip
    used = {ipaddress.ip_interface(w).network for w in taken.split() if "/" in w}
    count = _NETWORK.num_addresses // 4
    for _ in range(count):
        index = random.randrange(count)
        subnet = ipaddress.ip_network(f"{_NETWORK.network_address + index * 4}/30")
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise OSError(f"no free /30 left in {_NETWORK}")


def _ip(*argv: str) -> None:
    _run("ip", *argv)


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "a network partition needs root (CI runs as root)"
    tools = ("ip", "unshare", "nsenter", "setpriv")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"a network partition needs {', '.join(missing)} (iproute2, util-linux)"
    return None


def skip_or_fail(reason: str) -> None:
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1 but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def opened_partition() -> Iterator[Partition]:
    """A partition, open and not yet dropped; skipped (or failed, when required) with the
    reason where this host cannot build one; closed afterwards."""
    reason = _unavailable()
    if reason is not None:
        skip_or_fail(reason)
    partition = Partition()
    try:
        try:
            partition.open()
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", None) or exc
            skip_or_fail(f"this host cannot build a network namespace with veth: {detail}")
        yield partition
    finally:
        partition.close()


@contextlib.contextmanager
def partitioned(url: str) -> Iterator[tuple[str, Partition]]:
    """``url`` through a relay behind a partition the test can drop and heal."""
    parsed = make_url(url)
    with opened_partition() as partition:
        relay = Relay((parsed.host or "127.0.0.1", parsed.port or 5432), partition.listener())
        try:
            through = parsed.set(host=partition.there, port=relay.port)
            yield through.render_as_string(hide_password=False), partition
        finally:
            relay.cut()


def vanished_session(url: str, options: str) -> str:
    """Open a session of ``url``'s server with startup ``options``, then destroy its client
    socket silently; the ``application_name`` that tells its server process apart."""
    reason = None if os.geteuid() == 0 else "a socket destroyed silently needs root"
    if reason is not None:
        skip_or_fail(reason)
    parsed = make_url(url)
    name = f"ql-vanished-{os.getpid()}-{next(_serial)}"
    params = {
        "user": parsed.username or "postgres",
        "database": parsed.database or "postgres",
        "application_name": name,
        "options": options,
    }
    body = struct.pack("!I", 3 << 16)  # protocol 3.0
    body += b"".join(f"{k}\0{v}\0".encode() for k, v in params.items() if v) + b"\0"
    sock = socket.create_connection((parsed.host or "127.0.0.1", parsed.port or 5432), 10)
    try:
        sock.sendall(struct.pack("!I", len(body) + 4) + body)
        while True:  # until ReadyForQuery; trust authentication is all this speaks
            kind, size = struct.unpack("!cI", _exactly(sock, 5))
            payload = _exactly(sock, size - 4)
            if kind == b"E" or (kind == b"R" and payload[:4] != b"\0\0\0\0"):
                raise AssertionError(f"the server refused the session: {kind!r} {payload!r}")
            if kind == b"Z":
                break
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_REPAIR, 1)  # from now on nothing is sent
    finally:
        sock.close()  # in repair mode: gone, no FIN, no reset
    return name


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = sock.recv(n, socket.MSG_WAITALL)  # all n, unless the server closed first
    if len(data) != n:
        raise AssertionError("the server closed the connection during the startup")
    return data


def shorten_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection bounds of app/storage/engine.py cut to a second (libpq's least connect
    timeout is 2 s), so a test of a partition waits seconds; the defaults only scale them."""
    from app.storage import engine

    monkeypatch.setattr(engine, "PG_TCP_USER_TIMEOUT_MS", 1000)
    monkeypatch.setattr(engine, "PG_KEEPALIVES_IDLE_S", 1)
    monkeypatch.setattr(engine, "PG_KEEPALIVES_INTERVAL_S", 1)
    monkeypatch.setattr(engine, "PG_CONNECT_TIMEOUT_S", 2)
