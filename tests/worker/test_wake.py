"""The ``wake`` socket op: a content-free nudge to the recovery loop."""

from __future__ import annotations

from pathlib import Path

from app.adapters.worker_client import WorkerClient
from app.worker.server import ControlServer


class _Unused:
    def launch_started(self, request: object) -> object:  # pragma: no cover - never called
        raise AssertionError

    def stop(self, handle: object, *, grace_seconds: float) -> str:  # pragma: no cover
        raise AssertionError


def test_wake_reaches_the_loop_and_bad_flags_are_refused() -> None:
    calls: list[bool] = []
    unused = _Unused()
    server = ControlServer(
        path=Path("/nonexistent"), launcher=unused, controller=unused,  # type: ignore[arg-type]
        on_wake=calls.append,
    )
    assert server.handle_line(b'{"op":"wake"}') == {"ok": True}
    assert server.handle_line(b'{"op":"wake","reconcile":true}') == {"ok": True}
    assert server.handle_line(b'{"op":"wake","reconcile":1}') == {
        "ok": False, "error": "BAD_REQUEST"
    }
    assert calls == [False, True]
    plain = ControlServer(
        path=Path("/nonexistent"), launcher=unused, controller=unused,  # type: ignore[arg-type]
    )
    assert plain.handle_line(b'{"op":"wake"}') == {"ok": False, "error": "UNSUPPORTED"}


def test_client_wake_is_false_when_no_worker_listens(short_dir: Path) -> None:
    client = WorkerClient(short_dir / "w.sock", connect_timeout_s=0.5, retries=0)
    assert client.wake() is False
    client.close()
