"""Issue 11 §1 with real processes: a start that provably spawned nothing is requeued, never
failed, and a late launch of a fenced attempt never spawns.

The worker is the real ``qinglong worker`` (SIGSTOPped, SIGCONTed, SIGKILLed by pid); the api
side is the real dispatcher, coordinator and WorkerClient of the api's execution wiring.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from app.adapters.worker_client import WorkerClient
from app.context.execution_wiring import DispatchBackoff, build_execution
from app.domain.errors import LaunchRejected, WorkerUnavailable
from app.domain.ids import now_ms
from app.domain.model import Run
from app.domain.profiles import STANDALONE
from app.execution.dispatcher import Dispatcher, PassResult, build_dispatcher
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.journal_repo import FENCED
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import FakeSettings, MemorySecrets
from tests.recovery.kit import DEADLINE, TERMINAL, Armed, Rig, in_process_reconciler, wait_for
from tests.worker.kit import launch_request, make_log, stop_outside_a_write

RUN_ENDINGS = {f"run.{s}" for s in TERMINAL}


def _dispatcher(rig: Rig, client: WorkerClient) -> Dispatcher:
    return build_dispatcher(
        candidates=rig.reader, definitions=DefinitionRepository(rig.engine),
        secrets=MemorySecrets(), transitions=rig.runs, launcher=client, controller=client,
        settings_like=FakeSettings(rig.data_dir / "logs", STANDALONE),
    )  # fmt: skip


def _define(rig: Rig, script: str) -> None:
    DefinitionRepository(rig.engine).put_revision(
        task="sh", revision=1, executor="local_process", argv=["/bin/sh", "-c", script],
        cwd=str(rig.data_dir), recipe=None, timeout_seconds=None, priority=0,
    )  # fmt: skip


def _enqueue(rig: Rig) -> Run:
    run, _ = rig.runs.enqueue_run(task="sh", revision=1, priority=None)
    return run


def _run_endings(rig: Rig, run_id: str) -> list[str]:
    return [e.type for e in rig.reader.list_events(run_id, limit=1000).items if e.type in RUN_ENDINGS]


def _log_of(rig: Rig, attempt_id: str) -> bytes:
    found = list((rig.data_dir / "logs").rglob(f"{attempt_id}.log"))
    return found[0].read_bytes() if found else b""


def test_no_socket_requeues_the_run_and_it_runs_once_the_worker_is_back(rig: Rig) -> None:
    _define(rig, "echo ran")
    run = _enqueue(rig)
    client = WorkerClient(rig.worker.socket_path, connect_timeout_s=1.0, read_timeout_s=DEADLINE)
    try:
        with pytest.raises(WorkerUnavailable):
            client.ping()  # nobody listens: nothing can be delivered
        result = _dispatcher(rig, client).run_pass()
        assert result.worker_unavailable
        assert result.activated is not None and result.activated.kind == "requeued"
        requeued = rig.reader.get_run(run.id)
        assert requeued.status == "queued" and requeued.latest_attempt is not None
        assert requeued.latest_attempt.number == 2
        assert rig.journal.get(run.latest_attempt.id) is None  # type: ignore[union-attr]
        rig.worker.start()
        started = _dispatcher(rig, client).run_pass()
        assert started.activated is not None and started.activated.kind in ("started", "ended")
        wait_for(lambda: rig.reader.get_run(run.id).status in TERMINAL, "the run to end")
        done = rig.reader.get_run(run.id)
        assert done.status == "succeeded" and done.latest_attempt is not None
        assert done.latest_attempt.number == 2
        assert _log_of(rig, done.latest_attempt.id) == b"ran\n"
        assert _run_endings(rig, run.id) == ["run.succeeded"]
    finally:
        client.close()


def test_a_late_launch_of_a_fenced_attempt_is_refused_and_never_spawns(rig: Rig) -> None:
    rig.worker.start()
    a = rig.arm()
    entry = rig.journal.fence(attempt_id=a.attempt_id, run_id=a.run_id)
    assert entry.state == FENCED
    marker = rig.data_dir / "spawned"
    log = make_log(rig.data_dir / "logs", a.attempt_id)
    late = launch_request(a, argv=["/bin/sh", "-c", f"touch {marker}"], log_path=log)
    with pytest.raises(LaunchRejected) as info:
        rig.worker.client.launch(late)
    assert info.value.reason == "ATTEMPT_FENCED"
    # Requeued, and the fence row purged by retention: the old attempt is no longer
    # ``starting``, so the launcher still refuses it.
    rig.runs.requeue_unspawned(run_id=a.run_id, attempt_id=a.attempt_id)
    assert rig.journal.delete_settled(attempt_id=a.attempt_id, state=FENCED)
    with pytest.raises(LaunchRejected) as again:
        rig.worker.client.launch(late)
    assert again.value.reason == "ATTEMPT_NOT_STARTING"
    assert rig.journal.get(a.attempt_id) is None
    time.sleep(0.3)  # a shim, had one started, would have run `touch` by now
    assert not marker.exists() and rig.log_bytes(a) == b""
    assert not rig.store.path_of(a.attempt_id).exists()


def test_a_worker_stalled_past_the_start_grace_gets_its_start_fenced_and_requeued(
    rig: Rig,
) -> None:
    # SIGSTOP between the api's T1 and the worker journaling the launch (an SD-card fsync
    # stall does the same): the run must not fail, and the launch that the worker serves
    # once it continues must be refused, never spawned, with no second ending.
    _define(rig, "echo ran")
    rig.worker.start()
    assert rig.worker.proc is not None
    pid = rig.worker.proc.pid
    run = _enqueue(rig)
    assert run.latest_attempt is not None
    first = run.latest_attempt.id
    client = WorkerClient(rig.worker.socket_path, connect_timeout_s=1.0, read_timeout_s=DEADLINE)
    results: list[PassResult] = []
    # Frozen outside a write: frozen inside one it would hold SQLite's writer lock and T1
    # could not commit at all (the stall this test is about is the launch, not the database).
    stop_outside_a_write(rig.worker.proc, rig.engine)
    try:
        sender = threading.Thread(target=lambda: results.append(_dispatcher(rig, client).run_pass()))
        sender.start()
        # The pass must stay in the launch (the worker is frozen): one that already ended
        # never committed T1, and its outcome says why (a flake seen once under load).
        wait_for(
            lambda: rig.reader.get_run(run.id).status == "dispatching" or bool(results), "T1"
        )
        assert not results, f"the pass ended before the launch: {results[0].outcomes}"
        rig.past_start_grace(Armed(run.id, first, token=""))
        # The worker's recovery, as its reconciler would run once it continues.
        report = in_process_reconciler(rig.engine, rig.store, [now_ms()]).run_pass()
        assert report.requeued == 1 and report.failed == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    sender.join(DEADLINE)
    assert not sender.is_alive() and results
    outcome = results[0].activated
    assert outcome is not None and (outcome.kind, outcome.reason) == ("unresolved", "ATTEMPT_FENCED")
    entry = rig.journal.get(first)
    assert entry is not None and entry.state == FENCED  # the late launch never reserved
    assert _log_of(rig, first) == b""
    requeued = rig.reader.get_run(run.id)
    assert requeued.status == "queued" and requeued.latest_attempt is not None
    assert requeued.latest_attempt.number == 2
    # The worker is back: attempt 2 runs, and the run ends exactly once.
    started = _dispatcher(rig, client).run_pass()
    client.close()
    assert started.activated is not None and started.activated.kind in ("started", "ended")
    wait_for(lambda: rig.reader.get_run(run.id).status in TERMINAL, "the run to end")
    done = rig.reader.get_run(run.id)
    assert done.status == "succeeded"
    assert _run_endings(rig, run.id) == ["run.succeeded"]
    assert RunReader(rig.engine).get_attempt(run.id, 1).error_code == "EXECUTOR_UNAVAILABLE"


def test_a_worker_killed_mid_backlog_fails_no_run(rig: Rig) -> None:
    # The api's real drain (back-off included) against a backlog; the worker SIGKILLed by
    # pid while it launches, then started again as its supervisor would.
    _define(rig, "true")
    runs = [_enqueue(rig) for _ in range(24)]
    rig.worker.start()
    settings = Settings.from_env(
        {"QL_DATA_DIR": str(rig.data_dir), "QL_WORKER_SOCKET": str(rig.worker.socket_path)}
    )
    hooks = build_execution(
        settings, candidates=rig.reader, definitions=DefinitionRepository(rig.engine),
        secrets=MemorySecrets(), transitions=RunRepository(rig.engine),
        backoff=DispatchBackoff(base_s=0.05, cap_s=0.5),
    )  # fmt: skip
    stop = threading.Event()

    def drain_loop() -> None:
        while not stop.is_set():
            hooks.drain()
            time.sleep(0.02)

    drainer = threading.Thread(target=drain_loop)
    drainer.start()
    try:
        wait_for(
            lambda: sum(rig.reader.get_run(r.id).status != "queued" for r in runs) >= 6,
            "a few runs to be dispatched",
        )
        rig.kill_worker()
        time.sleep(0.3)  # the supervisor's restart delay: the drain meets no worker
        rig.worker.start()
        wait_for(
            lambda: all(rig.reader.get_run(r.id).status in TERMINAL for r in runs),
            "every run to end", timeout=60,
        )  # fmt: skip
    finally:
        stop.set()
        drainer.join(DEADLINE)
        hooks.close()
    ended = [rig.reader.get_run(r.id) for r in runs]
    others = [
        (r.status, r.latest_attempt.error_code if r.latest_attempt else None)
        for r in ended
        if r.status != "succeeded"
    ]
    # Every run succeeds, also one caught between the journal's reservation and its spawn
    # record: the shim's receipt reservation settles it (docs/reserved-launch.md).
    assert others == [], others
    for r in ended:
        assert _run_endings(rig, r.id) == [f"run.{r.status}"]
        for attempt in RunReader(rig.engine).list_attempts(r.id)[:-1]:
            assert (attempt.status, attempt.error_code) == ("failed", "EXECUTOR_UNAVAILABLE")
