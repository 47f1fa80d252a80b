"""Turn one dispatch candidate into a start command, strictly in docs/design.md §3.4 order.

Nothing is created on disk before step 7, and a missing revision, recipe or secret fails the
exact queued candidate (CAS on the version we read) before any file exists; a low disk keeps
it queued, untouched, until space returns.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from app.domain.artifacts import SHARD_NAMES, log_artifact_id, log_relpath
from app.domain.errors import (
    AdmissionRefused,
    Conflict,
    ErrorCode,
    InvalidTransition,
    KeyUnavailable,
    NotFound,
    SecretsMissing,
    ValidationFailed,
    VersionConflict,
)
from app.domain.execution import Leftovers
from app.domain.ids import now_ms
from app.domain.model import Recipe, Run, TaskRevision
from app.domain.profiles import RECEIPTS_BYTES_TO_START, Profile
from app.domain.states import AttemptStatus, RunStatus
from app.domain.validation import merge_environment, validate_env_value, validate_recipe
from app.execution.ports import (
    CandidateSource,
    DefinitionSource,
    DiskProbe,
    DispatchCandidateLike,
    LaunchRequest,
    RunTransitions,
    SecretSource,
)

# An empty log this old whose attempt is still claimed was left by a crash before T1.
ORPHAN_LOG_AGE_S = 60.0
# The first (and only) completion of a fresh attempt carries sequence 1 (stored is 0).
FIRST_CALLBACK_SEQUENCE = 1
_FILE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SettingsLike(Protocol):
    """What the execution layer reads from the service settings."""

    @property
    def logs_dir(self) -> Path: ...

    @property
    def receipts_dir(self) -> Path: ...

    @property
    def profile(self) -> Profile: ...


class CandidateGone(Exception):
    """The candidate changed (dispatched, cancelled, failed) since it was listed: skip it."""


class RunFailedBeforeStart(Exception):
    """Materialization refused the candidate; its run is now ``failed`` with ``code``."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.value)
        self.code = code


class ArtifactRefused(Exception):
    """The log artifact could not be created safely; the run stays queued (content-free)."""

    def __init__(self, reason: str, *, per_candidate: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        # True when only this candidate is affected (its file already exists); False when the
        # root or a shard is unsafe, which no other candidate can get past either.
        self.per_candidate = per_candidate


@dataclass(frozen=True)
class StartCommand:
    """Step 8: everything the coordinator needs except the callback token. Holds secrets."""

    run_id: str
    attempt_id: str
    attempt_number: int
    expected_version: int
    argv: tuple[str, ...] = field(repr=False)
    cwd: str | None = field(repr=False)
    env: dict[str, str] = field(repr=False)
    log_path: str
    log_artifact_id: str
    log_quota_bytes: int
    deadline_at_ms: int | None
    leftovers: Leftovers = "kill"
    run_as: str | None = None
    max_concurrent: int | None = None  # the revision's per-task budget, checked again in T1

    def launch_request(self, token: str) -> LaunchRequest:
        """The worker's request for this command with the fresh callback token."""
        return LaunchRequest(
            run_id=self.run_id,
            attempt_id=self.attempt_id,
            callback_sequence=FIRST_CALLBACK_SEQUENCE,
            token=token,
            argv=self.argv,
            cwd=self.cwd,
            env=dict(self.env),
            log_path=self.log_path,
            log_quota_bytes=self.log_quota_bytes,
            deadline_at_ms=self.deadline_at_ms,
            leftovers=self.leftovers,
            run_as=self.run_as,
        )


class StatvfsProbe:
    """Free bytes by ``os.statvfs`` on the nearest existing ancestor of a path."""

    def free_bytes(self, path: Path) -> int:
        """``f_bavail * f_frsize``: what an unprivileged writer may still use; 0 on a
        read-only file system, where nothing may be written."""
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        st = os.statvfs(probe)
        return 0 if st.f_flag & os.ST_RDONLY else st.f_bavail * st.f_frsize


_RACES = (VersionConflict, InvalidTransition)


class Materializer:
    """Steps 1-8 of a dispatch candidate (docs/design.md §3.4); stateless between calls."""

    def __init__(
        self,
        *,
        candidates: CandidateSource,
        definitions: DefinitionSource,
        secrets: SecretSource,
        transitions: RunTransitions,
        settings: SettingsLike,
        disk: DiskProbe | None = None,
        spares: LogSpares | None = None,
    ) -> None:
        self._candidates = candidates
        self._definitions = definitions
        self._secrets = secrets
        self._transitions = transitions
        self._settings = settings
        self._disk = disk or StatvfsProbe()
        self._spares = spares

    def materialize(
        self, candidate: DispatchCandidateLike, *, listed_now: bool = False
    ) -> StartCommand:
        """The start command; else CandidateGone, AdmissionRefused, RunFailedBeforeStart or
        ArtifactRefused.

        ``listed_now``: the candidate comes from a page read a moment ago, with nothing done
        since (a pass's first candidate): that read checked what step 1 checks, in the same
        way, so step 1 is not repeated (docs/design.md §3.4).
        """
        if not listed_now:
            self._reread(candidate)  # 1
        revision = self._revision(candidate)  # 2
        self._admit_task(candidate, revision)  # 2b, before any secret or file is touched
        recipe = self._recipe(candidate, revision)  # 3
        resolved = self._secret_values(candidate, recipe)  # 4
        env = self._environment(candidate, recipe, resolved)  # 5
        del resolved
        profile = self._settings.profile
        self._admit_disk(candidate, profile)  # 6
        log_path = self._create_log_artifact(candidate)  # 7
        deadline = None
        if revision.timeout_seconds is not None:
            deadline = now_ms() + revision.timeout_seconds * 1000
        return StartCommand(  # 8
            run_id=candidate.run_id,
            attempt_id=candidate.attempt_id,
            attempt_number=candidate.attempt_number,
            expected_version=candidate.version,
            argv=revision.argv,
            cwd=revision.cwd,
            env=env,
            log_path=str(log_path),
            log_artifact_id=log_artifact_id(candidate.attempt_id),
            log_quota_bytes=profile.log_quota_bytes,
            deadline_at_ms=deadline,
            leftovers=revision.leftovers,
            run_as=revision.run_as,
            max_concurrent=revision.max_concurrent,
        )

    def discard_artifact(self, command: StartCommand) -> None:
        """Remove the still-empty log of a command whose T1 never took (no shim has it)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(command.log_path)

    # -- steps -------------------------------------------------------------------------------

    def _reread(self, candidate: DispatchCandidateLike) -> Run:
        try:
            run = self._candidates.get_run(candidate.run_id)
        except NotFound:
            raise CandidateGone(candidate.run_id) from None
        attempt = run.latest_attempt
        if (
            run.status != RunStatus.QUEUED
            or run.cancel is not None
            or run.version != candidate.version
            or attempt is None
            or attempt.id != candidate.attempt_id
            or attempt.status != AttemptStatus.CLAIMED
            or run.task != candidate.task
            or run.revision != candidate.revision
        ):
            raise CandidateGone(candidate.run_id)
        return run

    def _admit_task(self, candidate: DispatchCandidateLike, revision: TaskRevision) -> None:
        """AdmissionRefused("task") when the revision's max_concurrent runs of its task are
        active already: the run stays queued, nothing is written (docs/concurrency-budgets.md
        §2). A pre-check only; T1 decides under its lock."""
        cap = revision.max_concurrent
        if cap is not None and self._candidates.active_count(candidate.task) >= cap:
            raise AdmissionRefused("task")

    def _revision(self, candidate: DispatchCandidateLike) -> TaskRevision:
        try:
            return self._definitions.get_revision(candidate.task, candidate.revision)
        except NotFound:
            raise self._fail(candidate, ErrorCode.REVISION_NOT_FOUND) from None

    def _recipe(self, candidate: DispatchCandidateLike, revision: TaskRevision) -> Recipe | None:
        if revision.recipe is None:
            return None  # a revision without a recipe runs with an empty environment
        try:
            return self._definitions.get_recipe(revision.recipe)
        except NotFound:
            raise self._fail(candidate, ErrorCode.RECIPE_NOT_FOUND) from None

    def _secret_values(
        self, candidate: DispatchCandidateLike, recipe: Recipe | None
    ) -> dict[str, str]:
        if recipe is None or not recipe.secrets:
            return {}
        names = frozenset(recipe.secrets.values())  # deduplicated: one lookup per name
        try:
            by_name = self._secrets.resolve(names)
        except SecretsMissing as exc:
            # The first missing name goes on the ending event: which secret to set.
            raise self._fail(
                candidate, ErrorCode.SECRET_NOT_FOUND, {"secret": exc.names[0]}
            ) from None
        except NotFound:
            raise self._fail(candidate, ErrorCode.SECRET_NOT_FOUND) from None
        except KeyUnavailable:
            # This host's key ring cannot decrypt it (several hosts must share QL_SECRET_KEY,
            # docs/several-hosts.md §6): a stable ending before any file or process exists.
            raise self._fail(candidate, ErrorCode.SECRET_KEY_UNAVAILABLE) from None
        if not names <= by_name.keys():
            missing = sorted(names - by_name.keys())[0]
            raise self._fail(candidate, ErrorCode.SECRET_NOT_FOUND, {"secret": missing})
        return {key: by_name[name] for key, name in recipe.secrets.items()}

    def _environment(
        self,
        candidate: DispatchCandidateLike,
        recipe: Recipe | None,
        resolved: dict[str, str],
    ) -> dict[str, str]:
        env = recipe.env if recipe is not None else {}
        refs = recipe.secrets if recipe is not None else {}
        try:
            validate_recipe(env, refs)  # defensive: a stored row is re-checked, never trusted
            for value in resolved.values():
                validate_env_value(value)
        except ValidationFailed as exc:
            raise self._fail(candidate, exc.code) from None
        reserved = {
            "QL3_RUN_ID": candidate.run_id,
            "QL3_ATTEMPT_ID": candidate.attempt_id,
            "QL3_ATTEMPT_NUMBER": str(candidate.attempt_number),
            "QL3_TASK": candidate.task,
            "QL3_REVISION": str(candidate.revision),
        }
        return merge_environment(env, resolved, reserved)

    def _admit_disk(self, candidate: DispatchCandidateLike, profile: Profile) -> None:
        """AdmissionRefused("disk") when free space minus the reserve does not cover a log's
        quota, or receipts/ (a file system of its own, perhaps) cannot take a receipt: the
        run stays queued, untouched, and starts once space returns (a run must not fail
        because the disk filled); nothing of it exists yet (step 7 is next)."""
        s = self._settings
        if (
            self._disk.free_bytes(s.logs_dir) < profile.free_bytes_to_start
            or self._disk.free_bytes(s.receipts_dir) < RECEIPTS_BYTES_TO_START
        ):
            raise AdmissionRefused("disk")

    def _create_log_artifact(self, candidate: DispatchCandidateLike) -> Path:
        root = self._settings.logs_dir
        shard, name = log_relpath(candidate.attempt_id).split("/")
        root_fd = _open_logs_root(root)
        try:
            shard_fd = _private_dir(root_fd, shard)
            try:
                try:
                    # The spare made ahead when there is one (it checks that the name it
                    # gave is that very file), else a file created here.
                    fd = (
                        None
                        if self._spares is None
                        else self._spares.adopt(root_fd, shard_fd, name)
                    )
                    if fd is None:
                        fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=shard_fd)
                except FileExistsError:
                    raise self._existing_log(candidate, shard_fd, name) from None
                except OSError:
                    raise ArtifactRefused("LOG_CREATE_FAILED", per_candidate=False) from None
                try:
                    os.fchmod(fd, 0o600)  # exact mode whatever the umask
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                        raise ArtifactRefused("LOG_UNSAFE", per_candidate=True)
                finally:
                    os.close(fd)
            finally:
                os.close(shard_fd)
        finally:
            os.close(root_fd)
        return root / shard / name

    def _existing_log(
        self, candidate: DispatchCandidateLike, shard_fd: int, name: str
    ) -> Exception:
        """O_EXCL lost: a racer's fresh file (skip), or an orphan of a crash before T1."""
        self._reread(candidate)  # raises CandidateGone when another process moved it on
        try:
            st = os.lstat(name, dir_fd=shard_fd)
        except OSError:
            return ArtifactRefused("LOG_EXISTS", per_candidate=True)
        orphan = (
            stat.S_ISREG(st.st_mode)
            and stat.S_IMODE(st.st_mode) == 0o600
            and st.st_uid == os.geteuid()
            and st.st_size == 0
            and st.st_nlink == 1
            and time.time() - st.st_mtime > ORPHAN_LOG_AGE_S
        )
        if orphan:
            # A process died between step 7 and T1 (the attempt is still claimed, so no shim
            # was ever given this path). Without this the run would stay queued for ever; the
            # next pass creates the file afresh. Never done for symlinks or foreign files.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=shard_fd)
            return ArtifactRefused("LOG_ORPHAN_REMOVED", per_candidate=True)
        return ArtifactRefused("LOG_EXISTS", per_candidate=True)

    def _fail(
        self,
        candidate: DispatchCandidateLike,
        code: ErrorCode,
        detail: dict[str, str] | None = None,
    ) -> Exception:
        """Fail the exact candidate we read; a lost CAS means somebody else moved it first.
        ``detail``: names for the ending event (a missing secret's), never a value."""
        try:
            self._transitions.fail_attempt(
                run_id=candidate.run_id,
                attempt_id=candidate.attempt_id,
                error_code=code,
                expected_version=candidate.version,
                detail=detail,
            )
        except (*_RACES, NotFound):
            return CandidateGone(candidate.run_id)
        except Conflict as exc:
            if exc.code is ErrorCode.RUN_TERMINAL:
                return CandidateGone(candidate.run_id)
            raise
        return RunFailedBeforeStart(code)


_SPARE_NAME = re.compile(r"\.spare-([0-9]{1,10})-([0-9]{1,20})-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class Spare:
    """An empty log file made ahead: its name in the logs root and its inode."""

    name: str
    inode: tuple[int, int]  # (st_dev, st_ino)


class LogSpares:
    """One empty log file made ahead in the logs root, which the next launch of this process
    links into its shard under its own name instead of creating it there (docs/design.md
    §3.4 step 7).

    On the bench host, creating a file in a shard directory took 0.15-1 ms on the way to
    the job, and a ``link()`` about 20 µs (bench/README.md). The spare is named after its
    process (``.spare-<pid>-<start ticks>-<random>``), so that several api processes keep one each
    and a later process can tell a dead one's leftover (``sweep``). The name is only a way to
    the inode: taking the spare links it to the log's name (``link`` never replaces, so a
    name already there is refused as ``O_EXCL`` refused it), checks the inode, and drops
    the spare's own name. Any step that fails leaves the ordinary ``O_CREAT`` path.
    """

    def __init__(self, root: Path, owner: tuple[int, int]) -> None:
        self._root = root
        self._prefix = f".spare-{owner[0]}-{owner[1]}-"
        self._lock = threading.Lock()  # drain threads take it, the background thread makes it
        self._held: Spare | None = None

    def make(self) -> bool:
        """Make the spare unless one is held; False when it could not be made (the next
        launch then creates its log as before)."""
        with self._lock:
            if self._held is not None:
                return True
        try:
            root_fd = _open_logs_root(self._root)
        except ArtifactRefused:
            return False
        # A fresh name each time: never another process's (pid namespaces sharing a data dir
        # may repeat a pid and start time), nor a name a launch may still be dropping.
        name = self._prefix + os.urandom(6).hex()
        try:
            fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=root_fd)
            try:
                os.fchmod(fd, 0o600)
                st = os.fstat(fd)
            finally:
                os.close(fd)
        except OSError:
            return False
        finally:
            os.close(root_fd)
        with self._lock:
            self._held = Spare(name, (st.st_dev, st.st_ino))
        return True

    def take(self) -> Spare | None:
        """The spare, now no longer held (one launch at a time gets it)."""
        with self._lock:
            spare, self._held = self._held, None
        return spare

    def adopt(self, root_fd: int, shard_fd: int, name: str) -> int | None:
        """Give the spare held now the log's ``name`` in the shard; an open descriptor of the
        log, or None when none is held or it could not be linked (the caller creates the log
        itself).

        FileExistsError when ``name`` exists (the spare is kept for the next launch).
        """
        spare = self.take()
        if spare is None:
            return None
        try:
            # Never through a symlink: a name that is not the spare's file is linked as it
            # is, then refused below.
            os.link(spare.name, name, src_dir_fd=root_fd, dst_dir_fd=shard_fd,
                    follow_symlinks=False)  # fmt: skip
        except FileExistsError:
            with self._lock:
                if self._held is None:
                    self._held = spare
            raise
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(spare.name, dir_fd=root_fd)
            return None
        fd = None
        try:
            # The name is ours (the link just made it, before any T1): anything but the very
            # file made ahead is taken back, and the caller creates the log itself.
            st = os.lstat(name, dir_fd=shard_fd)
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == spare.inode:
                fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=shard_fd)
                opened = os.fstat(fd)
                if (opened.st_dev, opened.st_ino) != spare.inode:  # swapped since the lstat
                    raise OSError("not the spare")
                # Its age is the launch's, as a file created now: the orphan rule
                # (ORPHAN_LOG_AGE_S) must see a racer's fresh log as fresh, however long
                # ago the spare was made. Until the spare's name is dropped below, the log
                # has two names, which the orphan rule never takes either.
                os.utime(fd)
                return fd
        except OSError:
            if fd is not None:
                os.close(fd)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(spare.name, dir_fd=root_fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=shard_fd)
        return None

    def sweep(self, alive: Callable[[int, int], bool]) -> int:
        """Remove the spares of processes ``alive(pid, start_ticks)`` says are gone (killed
        before using theirs, or between linking it and dropping its name); how many. Only
        names go: a log linked from one keeps its own. Our own and anything else are left."""
        try:
            root_fd = _open_logs_root(self._root)
        except ArtifactRefused:
            return 0
        removed = 0
        try:
            for entry in os.listdir(root_fd):
                found = _SPARE_NAME.fullmatch(entry)
                if found is None or entry.startswith(self._prefix):
                    continue
                if alive(int(found[1]), int(found[2])):
                    continue
                with contextlib.suppress(OSError):
                    os.unlink(entry, dir_fd=root_fd)
                    removed += 1
        except OSError:
            pass
        finally:
            os.close(root_fd)
        return removed


def prepare_log_shards(root: Path) -> int:
    """Create the logs root and every shard directory under it ahead of any launch (0700,
    checked as a launch checks them); how many could not be made.

    A run's log lands in one of 256 shards (``shard_of``), so on a fresh data dir most of
    the first few hundred runs made their shard on the way to their job, a ``mkdir`` of
    about 0.5 ms on the bench host (bench/README.md). The worker does the same for its
    receipt shards. Nothing here is required: a shard refused here (a file or symlink in
    its place, a full disk) is met again by the launch that needs it, which refuses that
    candidate's artifact as it always did (``LOG_DIR_UNSAFE``, ``LOG_DIR_CREATE_FAILED``).
    """
    try:
        root_fd = _open_logs_root(root)
    except ArtifactRefused:
        return len(SHARD_NAMES)
    refused = 0
    try:
        for shard in SHARD_NAMES:
            try:
                os.close(_private_dir(root_fd, shard))
            except ArtifactRefused:
                refused += 1
    finally:
        os.close(root_fd)
    return refused


def _open_logs_root(root: Path) -> int:
    """The logs root's descriptor, the root created (0700) with its parents if missing."""
    try:
        os.makedirs(root.parent, mode=0o700, exist_ok=True)
    except OSError:
        raise ArtifactRefused("LOG_DIR_CREATE_FAILED", per_candidate=False) from None
    return _private_dir(None, str(root))


def _private_dir(parent_fd: int | None, name: str) -> int:
    """Create (0700) or open a directory we own; refuse symlinks, other owners, other modes."""
    created = False
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        created = True
    except FileExistsError:
        pass
    except OSError:
        raise ArtifactRefused("LOG_DIR_CREATE_FAILED", per_candidate=False) from None
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except OSError:
        raise ArtifactRefused("LOG_DIR_UNSAFE", per_candidate=False) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ArtifactRefused("LOG_DIR_UNSAFE", per_candidate=False)
    if created and stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(name, 0o700, dir_fd=parent_fd)  # our own fresh dir: the umask narrowed it
    elif stat.S_IMODE(st.st_mode) != 0o700:
        raise ArtifactRefused("LOG_DIR_UNSAFE", per_candidate=False)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        raise ArtifactRefused("LOG_DIR_UNSAFE", per_candidate=False) from None
    # The directory we opened is the one we checked (no swap between lstat and open).
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise ArtifactRefused("LOG_DIR_UNSAFE", per_candidate=False)
    return fd


__all__ = [
    "ArtifactRefused",
    "CandidateGone",
    "LogSpares",
    "Materializer",
    "RunFailedBeforeStart",
    "SettingsLike",
    "Spare",
    "StartCommand",
    "StatvfsProbe",
    "prepare_log_shards",
]
