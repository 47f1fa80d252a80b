"""Bounded passes, ordering, races, the private surface (docs/design.md §3.3, docs/architecture.md §2)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from app.domain.artifacts import log_relpath
from app.domain.canonical import sha256_digest
from app.domain.profiles import EDGE, STANDALONE, Profile
from app.execution.dispatcher import Dispatcher
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import (
    FakeLauncher,
    Kit,
    MemorySecrets,
    define,
    enqueue,
    files_under,
    make_kit,
)

APP = Path(__file__).resolve().parents[2] / "app"


class CountingCandidates:
    """The real candidate source, recording each page request."""

    def __init__(self, engine: Engine) -> None:
        self._reader = RunReader(engine)
        self.limits: list[int] = []
        self.cursors: list[str | None] = []

    def dispatch_candidates(self, *, limit: int, cursor: str | None = None) -> Any:
        self.limits.append(limit)
        self.cursors.append(cursor)
        return self._reader.dispatch_candidates(limit=limit, cursor=cursor)

    def get_run(self, run_id: str) -> Any:
        return self._reader.get_run(run_id)


@pytest.mark.parametrize("profile", [EDGE, STANDALONE], ids=["edge", "standalone"])
def test_each_pass_reads_one_profile_page_and_activates_one_run(
    engine: Engine, tmp_path: Path, profile: Profile
) -> None:
    """Edge reads at most 4, standalone 16, one page per pass, one activation."""
    define(engine)
    runs = [enqueue(engine) for _ in range(profile.dispatch_page_size + 2)]
    kit = make_kit(engine, tmp_path / "logs", profile=profile)
    counting = CountingCandidates(engine)
    kit.dispatcher._candidates = counting  # spy on the page requests of the wired dispatcher
    result = kit.dispatcher.run_pass()

    assert counting.limits == [profile.dispatch_page_size]
    assert result.truncated
    assert [o.kind for o in result.outcomes] == ["started"]
    statuses = [kit.run(r.id).status for r in runs]
    assert statuses == ["running"] + ["queued"] * (len(runs) - 1)
    assert kit.launcher.calls == 1


def test_dispatch_order_is_priority_then_creation_and_stable_across_passes(
    engine: Engine, tmp_path: Path
) -> None:
    """Priority desc, then run creation asc; each pass starts the next one."""
    define(engine)
    low = enqueue(engine, priority=-5)
    first = enqueue(engine, priority=10)
    mid = enqueue(engine)
    second = enqueue(engine, priority=10)
    kit = make_kit(engine, tmp_path / "logs", profile=EDGE)
    started = []
    for _ in range(5):
        activated = kit.dispatcher.run_pass().activated
        if activated is not None:
            started.append(activated.run_id)
    assert started == [first.id, second.id, mid.id, low.id]


def test_pass_stops_after_first_activation_and_skips_nothing_it_did_not_examine(
    engine: Engine, tmp_path: Path
) -> None:
    """The candidates after the activated one are not even re-read."""
    define(engine)
    for _ in range(3):
        enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    result = kit.dispatcher.run_pass()
    assert len(result.outcomes) == 1
    assert len(files_under(kit.logs_dir)) == 1


def test_failed_candidates_do_not_count_as_activation(engine: Engine, tmp_path: Path) -> None:
    """A candidate failed before start is reported and the pass goes on to the next one."""
    define(engine, task="broken", secrets={"K": "nope"})
    define(engine, task="fine")
    broken = enqueue(engine, task="broken", priority=5)
    fine = enqueue(engine, task="fine")
    kit = make_kit(engine, tmp_path / "logs")
    result = kit.dispatcher.run_pass()
    assert [(o.run_id, o.kind) for o in result.outcomes] == [
        (broken.id, "failed_before_start"),
        (fine.id, "started"),
    ]


def test_launch_failure_is_reported_and_not_retried(engine: Engine, tmp_path: Path) -> None:
    """A launch failure goes back to the caller; no retry storm."""
    define(engine)
    failing = enqueue(engine, priority=1)
    other = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine, fail="EXEC_FAILED"))
    result = kit.dispatcher.run_pass()
    assert result.launch_failure is not None
    assert result.launch_failure.run_id == failing.id
    assert kit.launcher.calls == 1  # the pass stopped; ``other`` waits for the next pass
    assert kit.run(other.id).status == "queued"
    kit.dispatcher.run_pass()
    assert [o.request.run_id for o in kit.launcher.observed] == [failing.id, other.id]


class _CancelAfterListing(CountingCandidates):
    """The real pages; a cancel of ``victim`` committed right after the first was read."""

    def __init__(self, engine: Engine, victim: str) -> None:
        super().__init__(engine)
        self._repo = RunRepository(engine)
        self._victim = victim
        self.rereads: list[str] = []

    def dispatch_candidates(self, *, limit: int, cursor: str | None = None) -> Any:
        page = super().dispatch_candidates(limit=limit, cursor=cursor)
        if len(self.limits) == 1:  # after the first page only
            self._repo.request_cancel(run_id=self._victim, reason="user")
        return page

    def get_run(self, run_id: str) -> Any:
        self.rereads.append(run_id)
        return super().get_run(run_id)


def _cancelling_kit(engine: Engine, tmp_path: Path, victim: str) -> tuple[Kit, Any]:
    """A kit whose candidate source cancels ``victim`` right after its first page."""
    kit = make_kit(engine, tmp_path / "logs")
    source = _CancelAfterListing(engine, victim)
    kit.dispatcher._candidates = source
    kit.dispatcher._materializer._candidates = source
    return kit, source


def test_a_first_candidate_changed_after_listing_is_refused_by_t1(
    engine: Engine, tmp_path: Path
) -> None:
    """The pass's first candidate is taken as its page listed it, a moment before (no
    re-read); a cancel committed in that moment is caught by T1's own check: skipped, not
    failed, nothing launched for it and its empty log removed; the same pass starts the
    next run (re-read, as a later candidate)."""
    define(engine)
    gone = enqueue(engine, priority=1)
    nxt = enqueue(engine)
    kit, source = _cancelling_kit(engine, tmp_path, gone.id)
    result = kit.dispatcher.run_pass()
    assert [(o.run_id, o.kind) for o in result.outcomes] == [
        (gone.id, "skipped_race"),
        (nxt.id, "started"),
    ]
    assert source.rereads == [nxt.id] and kit.launcher.calls == 1
    nxt_attempt = kit.run(nxt.id).latest_attempt
    assert nxt_attempt is not None
    assert files_under(kit.logs_dir) == [kit.logs_dir / log_relpath(nxt_attempt.id)]
    assert kit.run(gone.id).status == "cancelled"
    assert kit.run(nxt.id).status == "running"


def test_a_later_candidate_changed_after_listing_is_skipped_at_its_reread(
    engine: Engine, tmp_path: Path
) -> None:
    """A candidate after others of the same pass is re-read (step 1): one cancelled since
    the page was read is skipped before its secrets, its file or T1."""
    define(engine, task="nosecret", secrets={"API_KEY": "missing"})
    define(engine)
    first = enqueue(engine, task="nosecret", priority=1)  # fails before start: not a launch
    gone = enqueue(engine)
    kit, source = _cancelling_kit(engine, tmp_path, gone.id)
    result = kit.dispatcher.run_pass()
    assert [(o.run_id, o.kind) for o in result.outcomes] == [
        (first.id, "failed_before_start"),
        (gone.id, "skipped_race"),
    ]
    assert source.rereads == [gone.id]
    assert kit.launcher.calls == 0 and files_under(kit.logs_dir) == []
    assert kit.run(gone.id).status == "cancelled"


def test_real_candidate_goes_through_coordinator_and_activation_race_makes_no_second_spawn(
    engine: Engine, tmp_path: Path
) -> None:
    """Another process wins T1 between our artifact and our T1: we launch nothing."""
    define(engine)
    run = enqueue(engine)
    repo = RunRepository(engine)

    class LosesT1:
        """Lets a rival commit T1 for the same attempt just before ours."""

        def __getattr__(self, name: str) -> Any:
            return getattr(repo, name)

        def begin_dispatch(self, **kwargs: Any) -> Any:
            repo.begin_dispatch(**(kwargs | {"token_digest": sha256_digest(b"rival")}))
            return repo.begin_dispatch(**kwargs)

    kit = make_kit(engine, tmp_path / "logs", transitions=LosesT1())
    result = kit.dispatcher.run_pass()
    assert [o.kind for o in result.outcomes] == ["skipped_race"]
    assert kit.launcher.calls == 0
    assert files_under(kit.logs_dir) == []  # our empty artifact was removed
    after = kit.run(run.id)
    assert (after.status, after.version) == ("dispatching", run.version + 2)

    # And two dispatchers listing the same candidate: only one ever launches it.
    again = enqueue(engine)
    a = make_kit(engine, tmp_path / "logs")
    b = make_kit(engine, tmp_path / "logs", launcher=a.launcher)
    page = RunReader(engine).dispatch_candidates(limit=4)
    b_page = RunReader(engine).dispatch_candidates(limit=4)
    assert [c.run_id for c in page.items] == [c.run_id for c in b_page.items] == [again.id]
    assert a.dispatcher.run_pass().activated is not None
    command_b = b.materializer
    with pytest.raises(Exception):  # noqa: B017 - CandidateGone: the re-read sees it moved
        command_b().materialize(b_page.items[0])
    assert a.launcher.calls == 1


def test_resume_cursor_moves_past_a_page_without_activation(
    engine: Engine, tmp_path: Path
) -> None:
    """Stuck candidates cannot starve the queue behind a full page."""
    define(engine)
    stuck = [enqueue(engine, priority=5) for _ in range(EDGE.dispatch_page_size)]
    behind = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs", profile=EDGE)
    for run in stuck:  # a planted file keeps each of them queued (refused, not failed)
        attempt = kit.run(run.id).latest_attempt
        assert attempt is not None
        path = kit.logs_dir / log_relpath(attempt.id)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        kit.logs_dir.chmod(0o700)
        path.write_bytes(b"")
    first = kit.dispatcher.run_pass()
    assert [o.reason for o in first.outcomes] == ["LOG_EXISTS"] * EDGE.dispatch_page_size
    assert first.truncated and first.activated is None
    second = kit.dispatcher.run_pass()
    assert second.activated is not None and second.activated.run_id == behind.id
    third = kit.dispatcher.run_pass()  # back to the top after an activation
    assert [o.run_id for o in third.outcomes] == [r.id for r in stuck]


def test_application_context_exposes_no_launcher_or_coordinator(
    engine: Engine, tmp_path: Path
) -> None:
    """The dispatcher's public surface is one method; no capability leaks out."""
    kit = make_kit(engine, tmp_path / "logs")
    public = {n for n in dir(kit.dispatcher) if not n.startswith("_")}
    assert public == {"run_pass"}
    assert isinstance(kit.dispatcher, Dispatcher)
    if importlib.util.find_spec("app.context.facade") is None:
        return  # the facade is checked by the composition root's own tests once it lands
    facade = importlib.import_module("app.context.facade").AppFacade
    public = {n.lower() for n in dir(facade) if not n.startswith("_")}
    for name in public:
        for banned in ("launch", "coordinat", "candidate", "materializ", "dispatch", "spawn"):
            assert banned not in name, f"AppFacade.{name} exposes an execution capability"


def test_execution_layer_imports_only_the_domain_its_ports_and_the_standard_library() -> None:
    """No adapter, ORM, web framework or worker import in app/execution (app.failure_log is
    the floor of the layers: a standard-library log policy, importing no other layer)."""
    allowed_app = ("app.domain", "app.execution", "app.failure_log")
    for source in sorted((APP / "execution").glob("*.py")):
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top == "app":
                    assert name.startswith(allowed_app), f"{source.name} imports {name}"
                else:
                    assert top in sys.stdlib_module_names, f"{source.name} imports {name}"


def test_secrets_source_sees_only_names(engine: Engine, tmp_path: Path) -> None:
    """The secret source is asked by name; values never travel back into results."""
    define(engine, secrets={"K": "name"})
    enqueue(engine)
    secrets = MemorySecrets({"name": "value-xyz"})
    kit = make_kit(engine, tmp_path / "logs", secrets=secrets)
    result = kit.dispatcher.run_pass()
    assert secrets.calls == [frozenset({"name"})]  # asked by name, once
    assert [o.kind for o in result.outcomes] == ["started"]  # the value was really used
    assert "value-xyz" not in repr(result)
