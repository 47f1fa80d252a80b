"""The one rule for ``spawned`` journal entries, case by case, at start-up and in a sweep.

Pure logic against fakes (no database, no process): the journal, the active-attempt read,
the probe and the completion service are in-memory stand-ins; the controller is the
execution kit's. Every case of an ended attempt runs through both walks, the start-up
``drain`` and the periodic ``sweep``, which must decide it the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from app.domain.model import ProcessHandle
from app.execution.completion import ConsumeResult
from app.execution.journal_settle import DRAIN_PAGE, JournalSettle, SettleReport
from tests.execution.kit import FakeController, fake_handle

WALKS = ["drain", "sweep"]


@dataclass
class Entry:
    attempt_id: str
    run_id: str
    state: str
    handle: ProcessHandle | None
    updated_at_ms: int


class FakeJournal:
    """Entries by attempt id; pages in (updated_at_ms, attempt_id) order, as the adapter."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.marked: list[str] = []
        self._lock = threading.Lock()

    def add(self, n: int, handle: ProcessHandle | None) -> Entry:
        entry = Entry(f"a{n:04d}", f"r{n:04d}", "spawned", handle, 1_000 + n)
        self.entries[entry.attempt_id] = entry
        return entry

    def state(self, attempt_id: str) -> str:
        return self.entries[attempt_id].state

    def get(self, attempt_id: str) -> Entry | None:
        return self.entries.get(attempt_id)

    def page_by_state(
        self, *, state: str, limit: int, after: tuple[int, str] | None = None
    ) -> Sequence[Entry]:
        with self._lock:
            rows = sorted(
                (e for e in self.entries.values() if e.state == state),
                key=lambda e: (e.updated_at_ms, e.attempt_id),
            )
        if after is not None:
            rows = [e for e in rows if (e.updated_at_ms, e.attempt_id) > after]
        return [replace(e) for e in rows[:limit]]  # copies: a read, not live rows

    def mark_consumed(self, *, attempt_id: str) -> bool:
        with self._lock:
            self.marked.append(attempt_id)
            entry = self.entries[attempt_id]
            if entry.state != "spawned":
                return False
            entry.state = "consumed"
            return True

    def delete_settled(self, *, attempt_id: str, state: str) -> bool:
        raise AssertionError("settling never deletes")


class FakeAttempts:
    """Which attempts are still active; counts the one query per page."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.queries = 0

    def active_among(self, attempt_ids: list[str]) -> dict[str, object]:
        self.queries += 1
        return {a: object() for a in attempt_ids if a in self.active}


class FakeProbe:
    """Alive jobs and shims by pid; a stop (through ``stopping``) ends the job."""

    def __init__(self) -> None:
        self.jobs: set[int] = set()
        self.shims: set[int] = set()

    def job_alive(self, handle: ProcessHandle) -> bool:
        return handle.pid in self.jobs

    def shim_alive(self, handle: ProcessHandle) -> bool:
        return handle.shim_pid in self.shims

    def stopping(self, handle: ProcessHandle) -> None:
        self.jobs.discard(handle.pid)


class FakeCompletion:
    """Receipts waiting by attempt id; consuming one marks the journal, as the real one."""

    def __init__(self, journal: FakeJournal, attempts: FakeAttempts, probe: FakeProbe) -> None:
        self.receipts: set[str] = set()
        self.calls: list[tuple[str, str, bool]] = []  # attempt, journal state, job alive
        self._journal, self._attempts, self._probe = journal, attempts, probe
        self.threads: set[str] = set()
        # A pause per call, as a database round trip takes: without one, the pool's first
        # thread can settle a whole page before the others take an entry.
        self.pause_s = 0.0

    def consume(self, *, run_id: str, attempt_id: str) -> ConsumeResult:
        time.sleep(self.pause_s)
        entry = self._journal.entries[attempt_id]
        job_alive = entry.handle is not None and entry.handle.pid in self._probe.jobs
        self.calls.append((attempt_id, entry.state, job_alive))
        self.threads.add(threading.current_thread().name)
        if attempt_id not in self.receipts:
            return ConsumeResult("absent")
        self.receipts.discard(attempt_id)
        entry.state = "consumed"  # same transaction as the ending (docs/design.md §3.12)
        status = "applied" if attempt_id in self._attempts.active else "already_terminal"
        return ConsumeResult(status)


class Rig:
    """A JournalSettle on fakes, with helpers to add entries of each kind."""

    def __init__(self, stop: Any = "stopped") -> None:
        self.journal = FakeJournal()
        self.attempts = FakeAttempts()
        self.probe = FakeProbe()
        self.completion = FakeCompletion(self.journal, self.attempts, self.probe)
        self.stop_states: list[str] = []  # the entry's journal state when the stop was sent
        self.controller = FakeController(stop, on_stop=self._on_stop)
        self.watched: list[str] = []
        self.settle = JournalSettle(
            attempts=self.attempts, journal=self.journal, completion=self.completion,
            probe=self.probe, controller=self.controller, stop_grace_s=0.0,
            watch=lambda run_id, attempt_id, handle: self.watched.append(attempt_id),
        )  # fmt: skip
        self._n = 0

    def _on_stop(self, handle: ProcessHandle) -> None:
        entry = next(e for e in self.journal.entries.values() if e.handle == handle)
        self.stop_states.append(entry.state)
        if self.controller.result != "unknown":
            self.probe.stopping(handle)

    def entry(
        self,
        *,
        active: bool = False,
        job: bool = False,
        shim: bool = False,
        receipt: bool = False,
        handle: ProcessHandle | str | None = "plausible",
    ) -> Entry:
        self._n += 1
        h = fake_handle(10_000 + 2 * self._n) if handle == "plausible" else handle
        assert not isinstance(h, str)
        entry = self.journal.add(self._n, h)
        if active:
            self.attempts.active.add(entry.attempt_id)
        if job and h is not None:
            self.probe.jobs.add(h.pid)
        if shim and h is not None:
            self.probe.shims.add(h.shim_pid)
        if receipt:
            self.completion.receipts.add(entry.attempt_id)
        return entry

    def walk(self, how: str) -> SettleReport:
        if how == "drain":
            return self.settle.drain()
        return self.settle.sweep(limit=DRAIN_PAGE)


# -- an attempt that already ended ------------------------------------------------------------


@pytest.mark.parametrize("how", WALKS)
def test_a_job_still_running_for_an_ended_attempt_is_stopped_before_its_entry_is_consumed(
    how: str,
) -> None:
    rig = Rig()
    e = rig.entry(job=True)  # the shim is dead (SIGKILLed), the job runs on
    report = rig.walk(how)
    assert rig.controller.calls == [e.handle]  # by its exact handle
    assert rig.stop_states == ["spawned"]  # the stop came before the entry left the scan set
    assert rig.completion.calls == [(e.attempt_id, "spawned", False)]  # consumed after it
    assert rig.journal.state(e.attempt_id) == "consumed"
    assert report.stopped == 1 and report.undecided == 0


@pytest.mark.parametrize("how", WALKS)
def test_an_unknown_stop_keeps_the_entry_and_consumes_nothing(how: str) -> None:
    rig = Rig(stop="unknown")
    e = rig.entry(job=True)
    report = rig.walk(how)
    assert rig.controller.calls == [e.handle]
    assert rig.completion.calls == [] and rig.journal.marked == []
    assert rig.journal.state(e.attempt_id) == "spawned"  # fail closed: the next sweep retries
    assert report.undecided == 1 and report.stopped == 0


@pytest.mark.parametrize("how", WALKS)
def test_a_stop_that_raises_keeps_its_entry_and_the_walk_goes_on(how: str) -> None:
    rig = Rig(stop=OSError("injected"))
    failing = rig.entry(job=True)
    after = rig.entry()  # dead, no receipt: settled although the entry before it failed
    report = rig.walk(how)
    assert rig.journal.state(failing.attempt_id) == "spawned"
    assert rig.journal.state(after.attempt_id) == "consumed"
    assert report.undecided == 1 and report.outcomes == {"failed": 1, "settled": 1}


@pytest.mark.parametrize("how", WALKS)
def test_an_ended_attempt_whose_job_exited_meanwhile_is_settled(how: str) -> None:
    rig = Rig(stop="already_exited")
    e = rig.entry(job=True)
    rig.walk(how)
    assert rig.controller.calls == [e.handle]
    assert rig.journal.state(e.attempt_id) == "consumed"


@pytest.mark.parametrize("how", WALKS)
@pytest.mark.parametrize("job", [False, True])
def test_a_live_shim_of_an_ended_attempt_is_watched_and_its_entry_kept(
    how: str, job: bool
) -> None:
    rig = Rig()
    e = rig.entry(job=job, shim=True)
    report = rig.walk(how)
    assert rig.controller.calls == ([e.handle] if job else [])  # a running job is stopped
    assert rig.completion.calls == [] and rig.journal.marked == []  # its receipt is to come
    assert rig.watched == [e.attempt_id]
    assert rig.journal.state(e.attempt_id) == "spawned"
    assert report.outcomes == {"watched": 1}


@pytest.mark.parametrize("how", WALKS)
def test_a_receipt_left_by_an_ended_attempt_is_replayed_not_marked(how: str) -> None:
    rig = Rig()
    e = rig.entry(receipt=True)
    report = rig.walk(how)
    assert rig.controller.calls == []
    assert rig.completion.calls == [(e.attempt_id, "spawned", False)]
    assert rig.journal.marked == []  # the completion transaction marked it itself
    assert rig.journal.state(e.attempt_id) == "consumed"
    assert report.outcomes == {"already_recorded": 1}  # its ending was recorded before


@pytest.mark.parametrize("how", WALKS)
def test_an_ended_attempt_with_nothing_left_is_marked_consumed(how: str) -> None:
    rig = Rig()
    e = rig.entry()
    report = rig.walk(how)
    assert rig.controller.calls == []
    assert rig.journal.marked == [e.attempt_id]
    assert report.outcomes == {"settled": 1}


@pytest.mark.parametrize("how", WALKS)
@pytest.mark.parametrize(
    "handle",
    [None, replace(fake_handle(20_000), pgid=1)],  # none, or a job not leading its group
    ids=["none", "unstoppable"],
)
def test_a_handle_exact_identity_cannot_act_on_is_never_signalled(
    how: str, handle: ProcessHandle | None
) -> None:
    rig = Rig()
    e = rig.entry(handle=handle, job=True, shim=True)
    rig.walk(how)
    assert rig.controller.calls == [] and rig.watched == []
    assert rig.journal.state(e.attempt_id) == "consumed"


# -- an attempt still active --------------------------------------------------------------


def test_the_drain_watches_the_live_shim_of_an_active_attempt() -> None:
    rig = Rig()
    e = rig.entry(active=True, job=True, shim=True)
    rig.settle.drain()
    assert rig.watched == [e.attempt_id]
    assert rig.controller.calls == [] and rig.completion.calls == []


def test_the_drain_consumes_what_an_active_attempts_exited_shim_left() -> None:
    rig = Rig()
    e = rig.entry(active=True, receipt=True)
    report = rig.settle.drain()
    assert rig.completion.calls == [(e.attempt_id, "spawned", False)]
    assert rig.journal.state(e.attempt_id) == "consumed" and rig.journal.marked == []
    assert report.outcomes == {"recorded": 1}


def test_an_active_attempt_without_receipt_is_left_to_the_attempt_pass() -> None:
    rig = Rig()
    e = rig.entry(active=True, job=True)  # shim dead, job alive: the attempt pass stops it
    report = rig.settle.drain()
    assert rig.controller.calls == [] and rig.journal.marked == []
    assert rig.journal.state(e.attempt_id) == "spawned"
    assert report.outcomes == {"left": 1}


def test_the_sweep_leaves_active_attempts_alone() -> None:
    rig = Rig()
    rig.entry(active=True, job=True, receipt=True)
    rig.entry(active=True, shim=True)
    report = rig.settle.sweep(limit=DRAIN_PAGE)
    assert report.examined == 0
    assert rig.controller.calls == [] and rig.completion.calls == [] and rig.watched == []


# -- walking ------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [0, 3])
def test_the_drain_settles_a_backlog_of_many_pages_in_one_call(threads: int) -> None:
    rig = Rig()
    rig.completion.pause_s = 0.001 if threads else 0.0
    count = 2 * DRAIN_PAGE + 20
    kept = [rig.entry(active=True, shim=True) for _ in range(10)]  # stay spawned
    for i in range(count):
        rig.entry(receipt=i % 2 == 0, active=i % 3 == 0)
    report = rig.settle.drain(threads=threads)
    assert report.examined == count + len(kept)  # each entry met once
    assert rig.attempts.queries == 3  # one active_among per page
    left = [e for e in rig.journal.entries.values() if e.state == "spawned"]
    active_absent = [e for i, e in enumerate(list(rig.journal.entries.values())[10:])
                     if i % 3 == 0 and i % 2 == 1]  # fmt: skip
    assert sorted(e.attempt_id for e in left) == sorted(
        e.attempt_id for e in kept + active_absent
    )
    if threads:
        assert len(rig.completion.threads) > 1
        assert all(name.startswith("ql-resume") for name in rig.completion.threads)
    else:
        assert rig.completion.threads == {threading.current_thread().name}


def test_the_sweep_is_bounded_and_resumes_after_its_cursor() -> None:
    rig = Rig(stop="unknown")
    entries = [rig.entry(job=True) for _ in range(5)]  # each stays spawned (undecided)
    seen = [rig.settle.sweep(limit=2).examined for _ in range(4)]
    assert seen == [2, 2, 1, 2]  # wrapped around after the short page
    assert rig.controller.calls[:5] == [e.handle for e in entries]


@pytest.mark.parametrize("how", WALKS)
def test_an_entry_failing_at_every_walk_is_logged_once_then_its_recovery(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The sweep meets a failing entry twice a second: one line per walk flooded the
    service's log. Its first failure is a line, the next ones within the minute none, and
    a walk that settles everything says it works again."""
    rig = Rig(stop=OSError("injected"))
    failing = rig.entry(job=True)
    with caplog.at_level("INFO", logger="app.execution.journal_settle"):
        for _ in range(5):
            assert failing.handle is not None
            rig.probe.jobs.add(failing.handle.pid)  # the stop raised: it may still run
            assert rig.walk(how).outcomes == {"failed": 1}
        rig.controller.result = "stopped"
        rig.walk(how)
    assert rig.journal.state(failing.attempt_id) == "consumed"
    assert [r.getMessage() for r in caplog.records] == [
        "journal settle of an entry failed: OSError",
        "journal settle of an entry works again after 5 failure(s)",
    ]
