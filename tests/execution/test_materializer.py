"""Materialization (docs/design.md §3.4-§3.6) on real databases, and the frozen environment."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from app.domain.artifacts import log_relpath
from app.domain.errors import Conflict
from app.domain.profiles import EDGE, MIB, RECEIPTS_BYTES_TO_START
from app.execution.dispatcher import build_dispatcher
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.secret_crypto import KeyRing, new_key
from app.storage.secrets_repo import SecretRepository
from tests.execution.kit import (
    FakeDisk,
    FakeSettings,
    HidingDefinitions,
    Kit,
    MemorySecrets,
    all_database_text,
    define,
    enqueue,
    files_under,
    make_kit,
)

SECRET_VALUE = "s3cr3t-plaintext-value-never-stored"


def _assert_failed_before_start(kit: Kit, run_id: str, code: str) -> None:
    result = kit.dispatcher.run_pass()
    assert [(o.kind, o.error_code) for o in result.outcomes] == [("failed_before_start", code)]
    after = kit.run(run_id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("failed", "failed")
    assert after.latest_attempt.error_code == code
    assert after.latest_attempt.log_artifact_id is None
    assert kit.launcher.calls == 0
    assert files_under(kit.logs_dir) == []
    assert [e.type for e in kit.events(run_id)] == ["run.queued", "attempt.failed", "run.failed"]


def test_missing_secret_fails_before_any_artifact_or_process(
    engine: Engine, tmp_path: Path
) -> None:
    """An unknown secret reference fails the run; no file, no launch."""
    define(engine, secrets={"API_KEY": "missing-secret"})
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    _assert_failed_before_start(kit, run.id, "SECRET_NOT_FOUND")
    assert kit.disk.probed == []  # step 6 was never reached
    # Its ending says which secret to set (a name, never a value).
    (ending,) = [e for e in kit.events(run.id) if e.type == "attempt.failed"]
    assert ending.data["secret"] == "missing-secret"


def test_missing_recipe_fails_before_any_artifact_or_process(
    engine: Engine, tmp_path: Path
) -> None:
    """A pinned recipe that cannot be read fails the run before step 7."""
    define(engine, secrets={"API_KEY": "k"})
    run = enqueue(engine)
    secrets = MemorySecrets({"k": "v"})
    kit = make_kit(
        engine, tmp_path / "logs", secrets=secrets,
        definitions=HidingDefinitions(engine, hide_recipe=True),
    )
    _assert_failed_before_start(kit, run.id, "RECIPE_NOT_FOUND")
    assert secrets.calls == []  # step 4 was never reached


def test_missing_revision_fails_before_any_artifact_or_process(
    engine: Engine, tmp_path: Path
) -> None:
    """A pinned revision that cannot be read fails the run before step 7."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(
        engine, tmp_path / "logs", definitions=HidingDefinitions(engine, hide_revision=True)
    )
    _assert_failed_before_start(kit, run.id, "REVISION_NOT_FOUND")


def test_a_low_disk_keeps_the_run_queued_until_space_returns(
    engine: Engine, tmp_path: Path
) -> None:
    """Free space minus the reserve must cover the quota; until it does the run waits,
    queued and untouched (no artifact, no launch, no event), and the pass stops."""
    define(engine)
    run = enqueue(engine)
    just_short = EDGE.free_space_reserve_bytes + EDGE.log_quota_bytes - 1
    disk = FakeDisk(just_short)
    kit = make_kit(engine, tmp_path / "logs", profile=EDGE, disk=disk)
    for _ in range(2):
        result = kit.dispatcher.run_pass()
        assert [o.kind for o in result.outcomes] == ["disk_low"] and result.disk_low
        assert kit.run(run.id).status == "queued"
    assert kit.launcher.calls == 0 and files_under(kit.logs_dir) == []
    assert [e.type for e in kit.events(run.id)] == ["run.queued"]
    disk.free = just_short + 1  # space is back: the same run starts
    kit.dispatcher.run_pass()
    assert kit.run(run.id).status == "running"


def test_receipts_that_cannot_take_a_receipt_keep_the_run_queued(
    engine: Engine, tmp_path: Path
) -> None:
    """receipts/ on a file system of its own, full or read-only (the probe says 0): the run
    waits queued, untouched, like a low disk for logs; it was failed RECEIPT_RESERVE_FAILED
    by the worker's launch before."""
    define(engine)
    run = enqueue(engine)
    disk = FakeDisk(receipts=RECEIPTS_BYTES_TO_START - 1)
    kit = make_kit(engine, tmp_path / "logs", profile=EDGE, disk=disk)
    result = kit.dispatcher.run_pass()
    assert [o.kind for o in result.outcomes] == ["disk_low"] and result.disk_low
    assert kit.launcher.calls == 0 and [e.type for e in kit.events(run.id)] == ["run.queued"]
    disk.receipts = RECEIPTS_BYTES_TO_START
    kit.dispatcher.run_pass()
    assert kit.run(run.id).status == "running"


def test_exactly_enough_disk_is_admitted(engine: Engine, tmp_path: Path) -> None:
    """The admission boundary: reserve + quota free bytes is enough."""
    define(engine)
    run = enqueue(engine)
    enough = EDGE.free_space_reserve_bytes + EDGE.log_quota_bytes
    kit = make_kit(engine, tmp_path / "logs", profile=EDGE, disk=FakeDisk(enough))
    kit.dispatcher.run_pass()
    assert kit.run(run.id).status == "running"
    assert kit.launcher.observed[0].request.log_quota_bytes == 4 * MIB


def test_materialization_follows_the_design_order(engine: Engine, tmp_path: Path) -> None:
    """Materialization order: revision, recipe, secrets, disk, artifact, T1, launch. The
    pass's first candidate is not re-read: its page was read a moment before (step 1)."""
    define(engine, secrets={"API_KEY": "k"})
    run = enqueue(engine)
    steps: list[str] = []
    logs = tmp_path / "logs"

    class Spy:
        def __init__(self, name: str, inner: Any) -> None:
            self._name, self._inner = name, inner

        def __getattr__(self, attr: str) -> Any:
            target = getattr(self._inner, attr)

            def call(*args: Any, **kwargs: Any) -> Any:
                steps.append(f"{self._name}.{attr}")
                if attr == "begin_dispatch":
                    steps.append(f"log_exists={bool(files_under(logs))}")
                return target(*args, **kwargs)

            return call

    base = make_kit(engine, logs, secrets=MemorySecrets({"k": "v"}))
    dispatcher = build_dispatcher(
        candidates=Spy("candidates", RunReader(engine)),
        definitions=Spy("definitions", DefinitionRepository(engine)),
        secrets=Spy("secrets", base.secrets),
        transitions=Spy("transitions", RunRepository(engine)),
        launcher=Spy("launcher", base.launcher),
        controller=base.controller,
        settings_like=FakeSettings(logs),
        disk=Spy("disk", base.disk),
    )
    dispatcher.run_pass()
    assert steps == [
        "candidates.dispatch_candidates",
        "definitions.get_revision",
        "definitions.get_recipe",
        "secrets.resolve",
        "disk.free_bytes",  # logs/
        "disk.free_bytes",  # receipts/
        "transitions.begin_dispatch",
        "log_exists=True",
        "launcher.launch",
        "transitions.record_running",
    ]
    assert base.run(run.id).status == "running"


def test_artifact_root_shard_and_file_permissions(engine: Engine, tmp_path: Path) -> None:
    """Root and shard 0700, file 0600 regular and ours, path from the attempt id."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    kit.dispatcher.run_pass()
    attempt = kit.run(run.id).latest_attempt
    assert attempt is not None
    path = kit.logs_dir / log_relpath(attempt.id)
    assert kit.launcher.observed[0].request.log_path == str(path)
    for directory in (kit.logs_dir, path.parent):
        st = os.lstat(directory)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert st.st_uid == os.geteuid()
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid() and st.st_size == 0 and st.st_nlink == 1


def _attempt_path(kit: Kit, run_id: str) -> Path:
    attempt = kit.run(run_id).latest_attempt
    assert attempt is not None
    return kit.logs_dir / log_relpath(attempt.id)


@pytest.mark.parametrize("place", ["root", "shard", "file"])
def test_symlinked_artifact_paths_are_refused_and_the_run_stays_queued(
    engine: Engine, tmp_path: Path, place: str
) -> None:
    """A symlink at the root, the shard or the file is never followed."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    path = _attempt_path(kit, run.id)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if place == "root":
        kit.logs_dir.symlink_to(elsewhere)
    else:
        path.parent.parent.mkdir(mode=0o700)
        if place == "shard":
            path.parent.symlink_to(elsewhere)
        else:
            path.parent.mkdir(mode=0o700)
            path.symlink_to(elsewhere / "target.log")
    result = kit.dispatcher.run_pass()
    assert [o.kind for o in result.outcomes] == ["artifact_refused"]
    assert kit.run(run.id).status == "queued"
    assert kit.launcher.calls == 0
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o711])
def test_artifact_directories_with_other_modes_are_refused(
    engine: Engine, tmp_path: Path, mode: int
) -> None:
    """An existing root or shard that is not exactly 0700 is not used."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    kit.logs_dir.mkdir()
    os.chmod(kit.logs_dir, mode)
    result = kit.dispatcher.run_pass()
    assert [(o.kind, o.reason) for o in result.outcomes] == [("artifact_refused", "LOG_DIR_UNSAFE")]
    assert kit.run(run.id).status == "queued"
    assert files_under(kit.logs_dir) == []


def test_an_existing_log_file_is_refused_without_failing_the_run(
    engine: Engine, tmp_path: Path
) -> None:
    """O_EXCL: a pre-existing file is neither reused nor truncated."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    path = _attempt_path(kit, run.id)
    path.parent.mkdir(mode=0o700, parents=True)
    os.chmod(kit.logs_dir, 0o700)
    path.write_bytes(b"planted")
    result = kit.dispatcher.run_pass()
    assert [(o.kind, o.reason) for o in result.outcomes] == [("artifact_refused", "LOG_EXISTS")]
    assert path.read_bytes() == b"planted"
    assert kit.run(run.id).status == "queued"


def test_secret_references_are_resolved_once_each(engine: Engine, tmp_path: Path) -> None:
    """Step 4: references are deduplicated before the secret source is asked."""
    define(engine, secrets={"A": "shared", "B": "shared", "C": "other"})
    run = enqueue(engine)
    secrets = MemorySecrets({"shared": "one", "other": "two"})
    kit = make_kit(engine, tmp_path / "logs", secrets=secrets)
    kit.dispatcher.run_pass()
    assert secrets.calls == [frozenset({"shared", "other"})]
    env = kit.launcher.observed[0].request.env
    assert (env["A"], env["B"], env["C"]) == ("one", "one", "two")
    assert kit.run(run.id).status == "running"


def test_job_environment_holds_only_recipe_values_secrets_and_ql3_ids(
    engine: Engine, tmp_path: Path
) -> None:
    """The frozen environment: recipe values, resolved secrets, our five QL3_* ids. Nothing else."""
    define(engine, task="report", env={"MODE": "fast"}, secrets={"TOKEN": "api"})
    run = enqueue(engine, task="report")
    kit = make_kit(engine, tmp_path / "logs", secrets=MemorySecrets({"api": SECRET_VALUE}))
    kit.dispatcher.run_pass()
    attempt = kit.run(run.id).latest_attempt
    assert attempt is not None
    assert kit.launcher.observed[0].request.env == {
        "MODE": "fast",
        "TOKEN": SECRET_VALUE,
        "QL3_RUN_ID": run.id,
        "QL3_ATTEMPT_ID": attempt.id,
        "QL3_ATTEMPT_NUMBER": "1",
        "QL3_TASK": "report",
        "QL3_REVISION": "1",
    }
    assert SECRET_VALUE not in repr(kit.launcher.observed[0].request)


def test_revision_without_recipe_runs_with_only_ql3_ids(engine: Engine, tmp_path: Path) -> None:
    """A revision without a recipe means an empty environment plus our ids."""
    define(engine, recipe=False, timeout_seconds=None)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    kit.dispatcher.run_pass()
    request = kit.launcher.observed[0].request
    assert sorted(request.env) == [
        "QL3_ATTEMPT_ID", "QL3_ATTEMPT_NUMBER", "QL3_REVISION", "QL3_RUN_ID", "QL3_TASK",
    ]
    assert request.deadline_at_ms is None
    assert kit.run(run.id).status == "running"


def test_immutable_definitions_replay_idempotently_and_secret_plaintext_stays_out_of_the_database(
    engine: Engine, tmp_path: Path
) -> None:
    """Same content is idempotent, different content conflicts, no plaintext stored."""
    repo = DefinitionRepository(engine)
    recipe, created = repo.put_recipe(env={"MODE": "x"}, secrets={"TOKEN": "api"})
    again, created_again = repo.put_recipe(env={"MODE": "x"}, secrets={"TOKEN": "api"})
    assert created and not created_again and again.id == recipe.id
    body: dict[str, Any] = {
        "task": "job", "revision": 1, "executor": "local_process", "argv": ["/bin/true"],
        "cwd": None, "recipe": recipe.id, "timeout_seconds": None, "priority": 0,
    }
    assert repo.put_revision(**body)[1] is True
    assert repo.put_revision(**body)[1] is False
    with pytest.raises(Conflict):
        repo.put_revision(**(body | {"argv": ["/bin/false"]}))

    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs", secrets=MemorySecrets({"api": SECRET_VALUE}))
    kit.dispatcher.run_pass()
    assert kit.run(run.id).status == "running"
    stored = all_database_text(engine)
    assert SECRET_VALUE not in stored
    assert kit.launcher.observed[0].request.token not in stored


@pytest.mark.parametrize("age_s", [5.0, 3600.0], ids=["fresh", "orphan"])
def test_an_empty_log_left_by_a_crash_before_t1_is_reclaimed_only_when_old(
    engine: Engine, tmp_path: Path, age_s: float
) -> None:
    """A crash between step 7 and T1 must not keep the run queued for ever."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    path = _attempt_path(kit, run.id)
    path.parent.mkdir(mode=0o700, parents=True)
    os.chmod(kit.logs_dir, 0o700)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    then = time.time() - age_s
    os.utime(path, (then, then))
    first = kit.dispatcher.run_pass()
    expected = "LOG_EXISTS" if age_s < 60 else "LOG_ORPHAN_REMOVED"
    assert [(o.kind, o.reason) for o in first.outcomes] == [("artifact_refused", expected)]
    assert kit.run(run.id).status == "queued"
    second = kit.dispatcher.run_pass()
    assert (second.activated is not None) == (age_s >= 60)


def test_a_secret_this_hosts_key_cannot_decrypt_fails_before_any_artifact_or_process(
    engine: Engine, tmp_path: Path
) -> None:
    """docs/several-hosts.md §6: another host stored it under a key this one lacks."""
    SecretRepository(engine, KeyRing([new_key()])).put(name="k", value=SECRET_VALUE)
    define(engine, secrets={"API_KEY": "k"})
    run = enqueue(engine)
    other_host = SecretRepository(engine, KeyRing([new_key()]))
    kit = make_kit(engine, tmp_path / "logs", secrets=other_host)
    _assert_failed_before_start(kit, run.id, "SECRET_KEY_UNAVAILABLE")
    assert kit.disk.probed == []  # step 6 was never reached
    assert SECRET_VALUE not in all_database_text(engine)
