"""Keep-alive HTTP clients for the rolling-restart tests (``http.client``: no retry, ever).

Each client holds one persistent connection and alternates ``GET /api/v1/runs/{id}`` with
``POST /api/v1/runs``. ``http.client`` reconnects by itself only after a response that said
``Connection: close``; a connection the server closes under it surfaces as an exception
(``RemoteDisconnected``, ``ConnectionResetError``, ``BrokenPipeError``), which is counted
as a failed request, as is any status other than the expected one.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    """Totals over all clients; ``failures`` by exception type or ``status <n>``."""

    requests: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    reconnects: int = 0


class KeepAliveLoad:
    """``clients`` threads sending until ``stop()`` or ``max_seconds``, whichever first.

    ``distinct_posts`` bounds how many runs the POSTs create: client ``c`` cycles through
    Idempotency-Keys ``c-0 .. c-(distinct_posts - 1)`` (a repeated key is answered from the
    first run, through the same route and transaction), or creates a new run every time
    when it is ``None``.
    """

    def __init__(
        self,
        *,
        port: int,
        token: str,
        task: str,
        run_id: str,
        clients: int = 4,
        max_seconds: float = 120.0,
        distinct_posts: int | None = 25,
    ) -> None:
        self._port = port
        self._headers = {"Authorization": f"Bearer {token}"}
        self._task = task
        self._run_id = run_id
        self._clients = clients
        self._deadline = time.monotonic() + max_seconds
        self._distinct = distinct_posts
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.result = LoadResult()
        self._threads = [
            threading.Thread(target=self._client, args=(n,), name=f"load-{n}", daemon=True)
            for n in range(clients)
        ]

    def start(self) -> KeepAliveLoad:
        """Start the clients; returns self."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> LoadResult:
        """Stop the clients (each finishes its current request) and return the totals."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return self.result

    def _client(self, n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=10)
        i = 0
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                outcome = self._one(conn, n, i)
                i += 1
                with self._lock:
                    self.result.requests += 1
                    if outcome == "reconnect":
                        self.result.reconnects += 1
                    elif outcome is not None:
                        self.result.failures[outcome] += 1
                if outcome not in (None, "reconnect"):
                    conn.close()  # a failed connection is not reused
        finally:
            conn.close()

    def _one(self, conn: http.client.HTTPConnection, n: int, i: int) -> str | None:
        if i % 2:
            key = f"{n}-{i}" if self._distinct is None else f"{n}-{i % self._distinct}"
            body = json.dumps({"task": self._task}).encode()
            headers = {**self._headers, "Content-Type": "application/json"}
            headers["Idempotency-Key"] = key
            method, path, ok = "POST", "/api/v1/runs", (200, 201)
        else:
            body, headers = None, self._headers
            method, path, ok = "GET", f"/api/v1/runs/{self._run_id}", (200,)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
        except (OSError, http.client.HTTPException) as exc:
            return type(exc).__name__
        if response.status not in ok:
            return f"status {response.status}"
        if response.will_close:
            return "reconnect"  # told Connection: close; the next request opens a new one
        return None
