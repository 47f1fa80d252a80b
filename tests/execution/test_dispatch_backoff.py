"""No silent retry storm (docs/design.md §3.3): the api's drain backs off while the worker is away.

The delay rule is pure (a fake clock); the drain is the real one, with a real WorkerClient
pointed at a socket path nobody listens on, then at a real worker.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from app.context.execution_wiring import DispatchBackoff, build_execution
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import CountingClient, MemorySecrets, define, enqueue


def test_the_delay_grows_to_its_cap_and_resets_when_the_worker_answers() -> None:
    now = [100.0]
    pause = DispatchBackoff(base_s=0.25, cap_s=2.0, clock=lambda: now[0])
    assert pause.due()
    delays = []
    for _ in range(6):
        pause.unavailable()
        delays.append(pause.delay_s)
        assert not pause.due()
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    now[0] += 1.99
    assert not pause.due()
    now[0] += 0.02
    assert pause.due()
    pause.answered()
    assert pause.delay_s == 0.0 and pause.due()
    pause.unavailable()
    assert pause.delay_s == 0.25  # a new episode starts from the base again


def test_a_drain_against_no_worker_pings_once_per_delay_and_leaves_runs_queued(
    engine: Engine, tmp_path: Path
) -> None:
    define(engine)
    run = enqueue(engine)
    now = [0.0]
    pause = DispatchBackoff(base_s=1.0, cap_s=4.0, clock=lambda: now[0])
    client = CountingClient(tmp_path / "absent.sock")
    settings = Settings.from_env({"QL_DATA_DIR": str(tmp_path / "data")})
    hooks = build_execution(
        settings, candidates=RunReader(engine), definitions=DefinitionRepository(engine),
        secrets=MemorySecrets(), transitions=RunRepository(engine), client=client, backoff=pause,
    )  # fmt: skip
    try:
        for _ in range(50):  # an enqueue storm kicks the drain 50 times at once
            hooks.drain()
        assert client.pings == 1
        for step in (1.0, 2.0, 4.0, 4.0):
            now[0] += step - 0.01
            hooks.drain()
            now[0] += 0.01
            hooks.drain()
        assert client.pings == 5  # once per elapsed delay: 1, 2, 4 (the cap), 4 s
        after = RunReader(engine).get_run(run.id)
        assert after.status == "queued" and after.latest_attempt is not None
        assert after.latest_attempt.number == 1  # never launched, never requeued
    finally:
        hooks.close()
