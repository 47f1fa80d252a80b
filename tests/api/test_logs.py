"""Log reads against a real file at the derived path: Range, tail, truncation, SSE follow."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, update

from app.domain.artifacts import log_head_bytes, log_relpath, truncation_fact_relpath
from app.domain.errors import DatabaseUnreachable, ErrorCode, NotFound
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.lease_repo import LeaseRepository
from app.storage.tables import attempts, worker_leases
from app.worker.identity import current_boot_id
from tests.api.conftest import Client, assert_problem, fail_run, make_running

CONTENT = b"line one\nline two\r\nunicode \xe2\x9c\x93 end\n"


def _run_with_log(
    client: Client, admin: dict[str, str], settings: Settings, content: bytes
) -> tuple[str, str, Path]:
    run_id = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin).json()["id"]
    attempt_id = make_running(settings, run_id)
    path = settings.logs_dir / log_relpath(attempt_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, content)
    os.close(fd)
    return run_id, attempt_id, path


def _url(run_id: str) -> str:
    return f"/api/v1/runs/{run_id}/attempts/1/log"


def _events(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":"):
                fields["comment"] = line
            elif ": " in line:
                key, value = line.split(": ", 1)
                fields[key] = value
        if fields:
            out.append(fields)
    return out


def test_whole_log_range_and_tail(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    run_id, _, _ = _run_with_log(client, admin, settings, CONTENT)
    whole = client.get(_url(run_id), headers=admin)
    assert whole.status_code == 200 and whole.content == CONTENT
    assert whole.headers["content-type"].startswith("text/plain")
    assert "x-log-truncated" not in whole.headers
    part = client.get(_url(run_id), headers=admin | {"Range": "bytes=5-7"})
    assert part.status_code == 206 and part.content == CONTENT[5:8]
    assert part.headers["content-range"] == f"bytes 5-7/{len(CONTENT)}"
    suffix = client.get(_url(run_id), headers=admin | {"Range": "bytes=-4"})
    assert suffix.status_code == 206 and suffix.content == CONTENT[-4:]
    open_end = client.get(_url(run_id), headers=admin | {"Range": "bytes=10-"})
    assert open_end.content == CONTENT[10:]
    tail = client.get(_url(run_id), params={"tail_bytes": 4}, headers=admin)
    assert tail.status_code == 200 and tail.content == CONTENT[-4:]
    ignored = client.get(_url(run_id), headers=admin | {"Range": "lines=1-2"})
    assert ignored.status_code == 200 and ignored.content == CONTENT


def test_unsatisfiable_range_is_416(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    run_id, _, _ = _run_with_log(client, admin, settings, CONTENT)
    response = client.get(_url(run_id), headers=admin | {"Range": f"bytes={len(CONTENT)}-"})
    assert_problem(response, 416, "RANGE_NOT_SATISFIABLE")
    assert response.headers["content-range"] == f"bytes */{len(CONTENT)}"


def test_a_running_log_is_said_cut_once_its_head_is_full_and_an_ended_one_as_recorded(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    """Past its head the shim holds the output's end in memory: the log may be losing bytes
    then, though it is below the quota. Once the ending is recorded, that record decides."""
    head = log_head_bytes(settings.profile.log_quota_bytes)
    run_id, attempt_id, path = _run_with_log(client, admin, settings, b"")
    os.truncate(path, head - 1)  # sparse: no 4 MiB written
    assert "x-log-truncated" not in client.get(_url(run_id), headers=admin).headers
    os.truncate(path, head)
    assert client.get(_url(run_id), headers=admin).headers["x-log-truncated"] == "true"
    run = client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert run["latest_attempt"]["log"]["truncated"] is True
    # The job ended with its tail appended and nothing dropped (no fact): not cut.
    os.truncate(path, settings.profile.log_quota_bytes)
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                update(attempts).where(attempts.c.id == attempt_id).values(
                    log_bytes=settings.profile.log_quota_bytes, log_truncated=False,
                    log_dropped_bytes=0,
                )
            )  # fmt: skip
    finally:
        engine.dispose()
    assert "x-log-truncated" not in client.get(_url(run_id), headers=admin).headers


def test_truncation_shows_in_the_header_and_the_run(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    run_id, attempt_id, _ = _run_with_log(client, admin, settings, CONTENT)
    (settings.logs_dir / truncation_fact_relpath(attempt_id)).write_bytes(
        b'{"droppedBytes":42,"gapAt":4,"quotaBytes":6,"reason":"quota","schemaVersion":1}'
    )
    response = client.get(_url(run_id), headers=admin)
    assert response.headers["x-log-truncated"] == "true"
    run = client.get(f"/api/v1/runs/{run_id}", headers=admin).json()
    assert run["latest_attempt"]["log"] == {
        "bytes": len(CONTENT),
        "truncated": True,
        "dropped_bytes": 42,
        "truncation_reason": "quota",
        "dropped_at": 4,
        "expired": False,
        "expired_at_ms": None,
    }


def test_a_symlinked_log_is_never_followed(
    client: Client, admin: dict[str, str], settings: Settings, task: str, tmp_path: Path
) -> None:
    run_id = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin).json()["id"]
    attempt_id = make_running(settings, run_id)
    path = settings.logs_dir / log_relpath(attempt_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"not yours")
    path.symlink_to(target)
    response = client.get(_url(run_id), headers=admin)
    assert response.status_code == 500
    assert b"not yours" not in response.content


def test_follow_of_a_finished_attempt_sends_everything_then_end(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    run_id, attempt_id, _ = _run_with_log(client, admin, settings, CONTENT)
    fail_run(settings, run_id, attempt_id)
    response = client.get(_url(run_id), params={"follow": "true"}, headers=admin)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _events(response.text)
    chunks = [e for e in events if e.get("event") == "chunk"]
    text = "".join(json.loads(e["data"])["text"] for e in chunks)
    assert text.encode() == CONTENT
    assert int(chunks[-1]["id"]) == len(CONTENT)
    assert events[-1]["event"] == "end"
    assert json.loads(events[-1]["data"]) == {"status": "failed", "bytes": len(CONTENT)}


def test_an_ended_log_removed_outside_the_service_is_410_log_missing_not_empty(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    """An ended attempt recorded its bytes; its file was deleted by hand. Answering 200 with
    nothing would read as a job that printed nothing."""
    run_id, attempt_id, path = _run_with_log(client, admin, settings, CONTENT)
    fail_run(settings, run_id, attempt_id)
    own = client.app.state.facade.own_instance_id  # this host's id on PostgreSQL, else None

    def record(target: str = attempt_id, **values: object) -> None:
        engine = make_engine(settings.database_url)
        try:
            with engine.begin() as conn:
                conn.execute(update(attempts).where(attempts.c.id == target).values(**values))
        finally:
            engine.dispose()

    # What the ending records: the shim's size, and the host that ran it.
    record(log_bytes=len(CONTENT), worker_instance_id=own)
    path.unlink()
    body = assert_problem(client.get(_url(run_id), headers=admin), 410, "LOG_MISSING")
    assert f"({len(CONTENT)} bytes were recorded)" in body["detail"]
    followed = client.get(_url(run_id), params={"follow": "true"}, headers=admin)
    assert_problem(followed, 410, "LOG_MISSING")  # before any stream, as LOG_EXPIRED
    # Several hosts: an attempt of no recorded host (older than migration 0008) may have
    # its log on another host, so its absence here proves nothing: still an empty log.
    record(worker_instance_id=None)
    single = client.app.state.facade
    client.app.state.facade = dataclasses.replace(single, own_instance_id="this-host")
    try:
        unknown = client.get(_url(run_id), headers=admin)
        assert unknown.status_code == 200 and unknown.content == b""
    finally:
        client.app.state.facade = single
    # An attempt that ended with no output recorded and no file is still an empty log.
    other, other_attempt, other_path = _run_with_log(client, admin, settings, b"")
    fail_run(settings, other, other_attempt)
    other_path.unlink()
    record(other_attempt, log_bytes=0, worker_instance_id=own)
    empty = client.get(_url(other), headers=admin)
    assert empty.status_code == 200 and empty.content == b""
    # One whose job started but whose size was never recorded (the file was gone at its
    # ending: removed while the job ran) lost its output: not an empty log either.
    record(other_attempt, log_bytes=None)
    body = assert_problem(client.get(_url(other), headers=admin), 410, "LOG_MISSING")
    assert "its size was never recorded" in body["detail"]
    # One that never started (its job never ran: no log was ever opened) reads empty.
    record(other_attempt, started_at_ms=None)
    never = client.get(_url(other), headers=admin)
    assert never.status_code == 200 and never.content == b""


def test_follow_resumes_from_last_event_id(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    run_id, attempt_id, _ = _run_with_log(client, admin, settings, CONTENT)
    fail_run(settings, run_id, attempt_id)
    response = client.get(
        _url(run_id), params={"follow": "true"}, headers=admin | {"Last-Event-ID": "10"}
    )
    chunks = [e for e in _events(response.text) if e.get("event") == "chunk"]
    assert json.loads(chunks[0]["data"])["offset"] == 10
    text = "".join(json.loads(e["data"])["text"] for e in chunks)
    assert text.encode() == CONTENT[10:]


class _CountingFacade:
    """Delegates to the real facade and counts log opens (each follow poll opens once)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.opens = 0
        self.changed = threading.Condition()

    def open_log(self, **kwargs: object) -> object:
        result = self._inner.open_log(**kwargs)  # type: ignore[attr-defined]
        with self.changed:
            self.opens += 1
            self.changed.notify_all()
        return result

    def wait_for_polls(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.opens >= count, timeout=10)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_follow_streams_a_growing_log_until_the_attempt_ends(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    state = client.app.state
    state.log_poll_s = 0.02
    state.log_heartbeat_s = 0.0  # a heartbeat on every poll that ends idle
    counting = _CountingFacade(state.facade)
    state.facade = counting
    run_id, attempt_id, path = _run_with_log(client, admin, settings, b"first\n")
    pieces = [b"second \xe2", b"\x9c\x93 split char\n", b"third\n"]

    def writer() -> None:
        # Each piece lands only after the follower polled again (a real condition, no sleeps).
        for piece in pieces:
            counting.wait_for_polls(counting.opens + 2)
            with path.open("ab") as fh:
                fh.write(piece)
        counting.wait_for_polls(counting.opens + 2)
        fail_run(settings, run_id, attempt_id)

    thread = threading.Thread(target=writer)
    thread.start()
    response = client.get(_url(run_id), params={"follow": "true"}, headers=admin)
    thread.join(timeout=30)
    assert not thread.is_alive()
    events = _events(response.text)
    chunks = [e for e in events if e.get("event") == "chunk"]
    text = "".join(json.loads(e["data"])["text"] for e in chunks)
    assert text == "first\nsecond \u2713 split char\n" + "third\n"  # never a broken character
    assert len(chunks) >= 3
    assert any("comment" in e for e in events)  # heartbeats while idle
    assert events[-1]["event"] == "end"


def test_odd_range_headers_never_fail(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    run_id, _, _ = _run_with_log(client, admin, settings, CONTENT)
    for header in (b"bytes=\xb2-", "bytes=5-2", "bytes=0-1,3-4", "bytes=-", "bytes=abc"):
        response = client.get(_url(run_id), headers=admin | {"Range": header})
        assert response.status_code == 200 and response.content == CONTENT, header
    big = client.get(_url(run_id), headers=admin | {"Range": "bytes=3-99999999999999999999"})
    assert big.status_code == 206 and big.content == CONTENT[3:]


def test_a_follow_refuses_a_last_event_id_that_is_no_offset_it_sent(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    # It restarted the follow at byte 0 (or at tail_bytes): the whole log again, silently.
    # An EventSource sends back only an id the stream sent, digits: anything else is a bug.
    run_id, attempt_id, _ = _run_with_log(client, admin, settings, CONTENT)
    fail_run(settings, run_id, attempt_id)
    for sent in (b"\xb2", "abc", "-5", "1.5", "1_0", "+5", "0x10", "", "1 0"):
        for params in ({"follow": "true"}, {"follow": "true", "tail_bytes": "4"}):
            headers = admin | {"Last-Event-ID": sent}
            response = client.get(_url(run_id), params=params, headers=headers)
            body = assert_problem(response, 422, "VALIDATION_FAILED")
            assert body["detail"].startswith("header.Last-Event-ID: must be the id"), (sent, body)
            assert "digits" in body["detail"]
    # Spaces around the digits are taken, as before; the header is read only by a follow.
    spaced = client.get(
        _url(run_id), params={"follow": "true"}, headers=admin | {"Last-Event-ID": " 10 "}
    )
    chunks = [e for e in _events(spaced.text) if e.get("event") == "chunk"]
    assert json.loads(chunks[0]["data"])["offset"] == 10
    plain = client.get(_url(run_id), headers=admin | {"Last-Event-ID": "abc"})
    assert plain.status_code == 200 and plain.content == CONTENT


def test_tail_bytes_takes_plain_decimal_digits_only(
    client: Client, admin: dict[str, str], settings: Settings, task: str
) -> None:
    run_id, _, _ = _run_with_log(client, admin, settings, CONTENT)
    for spelling in ("5.0", "1_0", "+5", " 5", "-5", "1e1", ""):
        for params in ({"tail_bytes": spelling}, {"tail_bytes": spelling, "follow": "true"}):
            response = client.get(_url(run_id), params=params, headers=admin)
            body = assert_problem(response, 422, "VALIDATION_FAILED")
            assert body["detail"].startswith("query.tail_bytes: "), (params, body)
            assert "plain decimal digits" in body["detail"], (params, body)
    tail = client.get(_url(run_id), params={"tail_bytes": "010"}, headers=admin)
    assert tail.status_code == 200 and tail.content == CONTENT[-10:]


class _FailingFacade(_CountingFacade):
    """The real facade for the route's open and the stream's first poll; then its log opens
    raise ``fail`` (what the engine raises when the database went away, or a refusal that
    came meanwhile)."""

    fail: Exception | None = None

    def open_log(self, **kwargs: object) -> object:
        if self.opens >= 2 and self.fail is not None:
            raise self.fail
        return super().open_log(**kwargs)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        # An outage ends the stream with a comment only: every client resumes, older ones too.
        (DatabaseUnreachable(), None),
        (NotFound(ErrorCode.RUN_NOT_FOUND, "no such run"), "RUN_NOT_FOUND"),
    ],
)
def test_an_outage_or_a_refusal_during_a_follow_ends_it_cleanly_not_with_a_cut(
    client: Client,
    admin: dict[str, str],
    settings: Settings,
    task: str,
    error: Exception,
    code: str | None,
) -> None:
    """Raised on after the response began, it reached the exception handlers: a RuntimeError
    in the api's log and a stream cut with no ending event (several-hosts walk-through)."""
    state = client.app.state
    state.log_poll_s = 0.02
    failing = _FailingFacade(state.facade)
    failing.fail = error
    state.facade = failing
    run_id, _, _ = _run_with_log(client, admin, settings, CONTENT)
    response = client.get(_url(run_id), params={"follow": "true"}, headers=admin)
    events = _events(response.text)
    if code is None:
        assert [e.get("event") for e in events if "event" in e] == ["chunk"], events
        assert events[-1]["comment"].startswith(": DATABASE_UNREACHABLE: the stream ends")
        return
    assert [e.get("event") for e in events] == ["chunk", "error"], events
    assert json.loads(events[-1]["data"])["code"] == code


def test_another_machines_log_is_never_forwarded_to_a_loopback_address_here(
    client: Client, admin: dict[str, str], settings: Settings, task: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host on another machine (another boot id) that advertised 127.0.0.1 (its default
    when it binds loopback behind a proxy) holds the log: forwarded, the reader's token went
    to whatever listens on that port of this machine, a job's listener perhaps. Refused with
    LOG_HOST_UNAVAILABLE; a host of this machine (the same boot id) is still forwarded to."""
    seen: list[str | None] = []

    class Listener(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "6")
            self.end_headers()
            self.wfile.write(b"remote")

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    run_id, attempt_id, _ = _run_with_log(client, admin, settings, CONTENT)
    fail_run(settings, run_id, attempt_id)
    engine = make_engine(settings.database_url)
    single = client.app.state.facade
    leases = LeaseRepository(engine)
    try:
        with engine.begin() as conn:
            conn.execute(update(attempts).where(attempts.c.id == attempt_id).values(worker_instance_id="other-host"))
            conn.execute(insert(worker_leases).values(
                slot=leases.slot_of("other-host"), instance_id="other-host", host="far-away",
                boot_id="another-machine", pid=1, start_ticks=1, epoch=1, acquired_at_ms=1,
                renewed_at_ms=1, expires_at_ms=2**50, released_at_ms=None,
                base_url=f"http://127.0.0.1:{server.server_address[1]}",
            ))  # fmt: skip
        client.app.state.facade = dataclasses.replace(
            single, own_instance_id="this-host", _leases=leases
        )
        port = server.server_address[1]
        here, me = current_boot_id(), socket.gethostname()
        refused = [
            ("another-machine", "far-away", f"http://127.0.0.1:{port}"),
            # Another container of this machine: the same boot id, its own host name.
            (here, "other-container", f"http://127.0.0.1:{port}"),
            # Spellings a connect takes to this machine too.
            ("another-machine", "far-away", f"http://127.1:{port}"),
            ("another-machine", "far-away", f"http://2130706433:{port}"),
            ("another-machine", "far-away", f"http://[::ffff:127.0.0.1]:{port}"),
            ("another-machine", "far-away", f"http://0.0.0.0:{port}"),
            ("another-machine", "far-away", f"http://localhost.:{port}"),
            # A name that resolves here to this machine (Debian maps its own host name to
            # 127.0.1.1: two machines of one default name would each reach themselves).
            ("another-machine", "far-away", f"http://raspberrypi.test:{port}"),
        ]
        real_getaddrinfo = socket.getaddrinfo

        def getaddrinfo(host: str, *args: Any, **kw: Any) -> Any:
            if host == "raspberrypi.test":
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", 0))]
            return real_getaddrinfo(host, *args, **kw)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        for boot, host, url in refused:
            with engine.begin() as conn:
                conn.execute(update(worker_leases).values(boot_id=boot, host=host, base_url=url))
            got = client.get(_url(run_id), headers=admin)
            body = assert_problem(got, 503, "LOG_HOST_UNAVAILABLE")
            assert host in body["detail"] and seen == [], (boot, host, url)
        with engine.begin() as conn:  # a host of this machine and network: forwarded
            conn.execute(
                update(worker_leases)
                .values(boot_id=here, host=me, base_url=f"http://127.0.0.1:{port}")
            )  # fmt: skip
        forwarded = client.get(_url(run_id), headers=admin)
        assert forwarded.content == b"remote" and seen == [admin["Authorization"]]
    finally:
        client.app.state.facade = single
        server.shutdown()
        server.server_close()
        engine.dispose()
