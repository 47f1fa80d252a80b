"""The worker's launcher: journal first, then spawn the per-job shim (docs/design.md §3.9).

Order of one launch, each step only after the previous one succeeded:

1. ``journal.reserve`` commits a ``reserved`` row, only while the attempt is ``starting`` in
   the database (the primary key refuses a second one, so two launches of one attempt, even
   concurrent or from two workers, never both spawn; nor does one after recovery fenced the
   attempt, or requeued it);
2. the receipt shard directory exists (0700);
3. the shim is started in its own session with the spec (``api-schemas/launch-protocol.md``):
   forked by the zygote (``QL_SHIM_MODE=zygote``, the default; §8) or as a fresh
   interpreter given the spec on stdin (``exec``, and the fallback when no zygote starts);
4. one status line is read, bounded by a deadline;
5. ``journal.record_spawned`` stores the handle, and only then is the handle returned. With
   ``running`` (the worker's composition), the same transaction also writes T2: the attempt
   and run ``running`` with the handle and the job's start as the shim reported it
   (docs/design.md §3.7); when T2 is refused there, the entry is ``spawned`` alone and the
   caller writes T2 as before.

Any failure before the handle is durable leaves nothing running: the shim's session is
killed (the session id is pinned because the first shim process is still unreaped: our
child, or the zygote's until we release it), and an already spawned job is stopped by
exact identity.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol

from app.domain.artifacts import receipt_name, receipt_relpath
from app.domain.errors import LaunchFailed, LaunchRejected
from app.domain.execution import Launched, LaunchRequest, StopResult
from app.domain.ids import is_uuid7
from app.domain.model import ProcessHandle
from app.settings import SHIM_MODES
from app.storage.journal_repo import (
    FENCED,
    RESERVED,
    SPAWNED,
    AlreadyReserved,
    JournalRepository,
    NotStarting,
)
from app.worker.cgroups import PREFIX as CGROUP_PREFIX
from app.worker.cgroups import CgroupRoot, settle
from app.worker.identity import ProcessIdentity, current_boot_id, stat_fields, stop_identity
from app.worker.job_user import JobPolicy
from app.worker.receipts import ReceiptStore
from app.worker.zygote import ForkFailed, NotReceived, Uncertain, Zygote, ZygoteUnavailable

log = logging.getLogger(__name__)

# Run by path (`-I -S`: it imports nothing from app), so located as package data: a file in
# site-packages after `pip install .`, in the checkout for an editable install.
SHIM_PATH = str(resources.files("app.worker").joinpath("shim.py"))
# The shim runs as ``__main__``, as ``python -I -S shim.py`` would, but from its cached
# bytecode (``__pycache__``, written by pip at install or by the first start): a script
# named on the command line is compiled from source at every start, which took half of a
# one-shot shim's start-up, and the compiler's leftovers stayed in the zygote's heap, 3.4
# MiB more anonymous memory that every fork of it maps and tears down again (figures:
# bench/README.md, "Figures behind choices"). Loaded through the import system's own
# loader, already in memory: no module imported, nothing added to ``sys.path``. The shim's
# path is the first argument and is taken out, so the shim sees ``sys.argv[1:]`` as it
# would as a script. A cached file the loader accepts but cannot unmarshal (its body cut
# short by a power cut) would fail every start: the source is compiled instead.
SHIM_BOOT = (
    "import sys, _frozen_importlib_external as x\n"
    "path = sys.argv.pop(1)\n"
    "main = type(sys)('__main__')\n"
    "main.__file__ = path\n"
    "sys.modules['__main__'] = main\n"
    "try:\n"
    "    code = x.SourceFileLoader('__main__', path).get_code('__main__')\n"
    "except (EOFError, ValueError, TypeError):\n"
    "    with open(path, 'rb') as source:\n"
    "        code = compile(source.read(), path, 'exec', dont_inherit=True)\n"
    "exec(code, main.__dict__)\n"
)


def shim_argv(python: str = sys.executable, shim_path: str = SHIM_PATH) -> list[str]:
    """How the worker starts a shim (launch-protocol.md §1); the zygote's start (§8) appends
    ``--zygote`` and the receipts root. ``-I`` keeps every ``PYTHON*`` setting of the service
    from the shim, ``PYTHONDONTWRITEBYTECODE`` too: the shim's first start writes its
    bytecode where the directory allows, as any import does."""
    return [python, "-I", "-S", "-c", SHIM_BOOT, shim_path]


PROTOCOL = 1
STATUS_MAX_BYTES = 4096
DEFAULT_STATUS_TIMEOUT_S = 10.0
_CGROUP_END_S = 2.0
_STATUS_INT_KEYS = ("shim_pid", "shim_start_ticks", "pid", "pgid", "start_ticks", "started_at_ms")

SpawnedCallback = Callable[[str, str, ProcessHandle], None]


class RunningRecorder(Protocol):
    """The journal's spawn record and T2 in one transaction (RunRepository)."""

    def record_spawned_running(
        self, *, run_id: str, attempt_id: str, handle: ProcessHandle, started_at_ms: int
    ) -> Literal["running", "spawned", "not_reserved"]: ...


@dataclass
class _Started:
    """A first shim process whose status line is awaited on ``status_fd``."""

    status_fd: int
    session: int | None  # its pid = its session id, pinned until ``reap``; None if unknown
    reap: Callable[[], None]
    deadline: float


class ShimLauncher:
    """Implements the Launcher port inside the worker process."""

    def __init__(
        self,
        *,
        journal: JournalRepository,
        receipts: ReceiptStore,
        on_spawned: SpawnedCallback | None = None,
        status_timeout_s: float = DEFAULT_STATUS_TIMEOUT_S,
        python: str = sys.executable,
        shim_path: str = SHIM_PATH,
        before_spawn: Callable[[LaunchRequest], None] | None = None,
        spec_extra: dict[str, Any] | None = None,
        mode: str = SHIM_MODES[0],
        cgroup_root: CgroupRoot | None = None,
        job_policy: JobPolicy | None = None,
        running: RunningRecorder | None = None,
        max_processes: int | None = None,
    ) -> None:
        """Settings arrive explicitly from the worker's composition root (``Settings``):
        ``mode`` is QL_SHIM_MODE, ``job_policy`` the checked QL_JOB_USER* (None: jobs run as
        the service's user), ``max_processes`` QL_JOB_MAX_PROCESSES (None: off); nothing here
        reads the environment."""
        self._journal = journal
        self._running = running  # None: the journal entry alone; the caller writes T2
        self._receipts = receipts
        self._on_spawned = on_spawned
        self._status_timeout_s = status_timeout_s
        self._argv = shim_argv(python, shim_path)
        if mode not in SHIM_MODES:
            raise ValueError(f"shim mode must be one of {', '.join(SHIM_MODES)}, not {mode!r}")
        self._zygote = (
            Zygote(
                argv=self._argv,
                reply_timeout_s=status_timeout_s,
                receipts_root=str(receipts.root.absolute()),
            )
            if mode == "zygote"
            else None
        )
        self._before_spawn = before_spawn  # test hook: observe state right before the spawn
        self._spec_extra = dict(spec_extra or {})  # test hook: e.g. the shim's test_hook
        self._cgroup_root = cgroup_root  # None: leftovers are stopped by process tree only
        self._job_policy = job_policy
        self._max_processes = max_processes

    def launch(self, request: LaunchRequest) -> ProcessHandle:
        """Start the attempt once and return its durable handle, or raise LaunchFailed."""
        return self.launch_started(request).handle

    def launch_started(self, request: LaunchRequest, *, t2: bool = False) -> Launched:
        """``launch``, plus the job's start time as its shim reported it (None when the handle
        is the one of an earlier launch of this attempt) and whether T2 was written here:
        only with ``t2`` (the caller leaves T2 to the worker) and a ``running`` recorder."""
        if not (is_uuid7(request.run_id) and is_uuid7(request.attempt_id)):
            raise LaunchFailed("BAD_REQUEST")
        job = self._job_spec(request.run_as)  # before the journal: a refusal spawns nothing
        try:
            self._journal.reserve(
                attempt_id=request.attempt_id,
                run_id=request.run_id,
                receipt_ref=receipt_relpath(request.attempt_id),
                only_if_starting=True,
            )
        except NotStarting:
            # Its start ended (requeued, failed) before this request was served: a late one.
            raise LaunchRejected("ATTEMPT_NOT_STARTING") from None
        except AlreadyReserved as exc:
            entry = exc.entry
            same_run = entry.run_id == request.run_id
            if entry.state == SPAWNED and entry.handle is not None and same_run:
                return Launched(entry.handle, None)
            if entry.state == FENCED:
                raise LaunchRejected("ATTEMPT_FENCED") from None  # recovery requeues it
            in_flight = entry.state == RESERVED and same_run
            raise LaunchRejected("LAUNCH_IN_FLIGHT" if in_flight else "ALREADY_LAUNCHED") from None
        try:
            shard = self._receipts.ensure_shard(request.attempt_id)
        except OSError:
            self._journal.record_spawn_failed(attempt_id=request.attempt_id)
            raise LaunchFailed("RECEIPT_DIR_FAILED") from None
        if self._before_spawn is not None:
            self._before_spawn(request)
        handle, started_at_ms = self._spawn(request, shard, job)
        running = False
        try:
            if self._running is None or not t2:
                recorded = self._journal.record_spawned(
                    attempt_id=request.attempt_id, handle=handle
                )
            else:
                written = self._running.record_spawned_running(
                    run_id=request.run_id, attempt_id=request.attempt_id, handle=handle,
                    started_at_ms=started_at_ms,
                )  # fmt: skip
                recorded, running = written != "not_reserved", written == "running"
        except Exception:
            recorded = False
        if not recorded:
            # Not durable: never return a handle the journal does not know (docs/design.md §3.9).
            stop_handle(handle, grace_seconds=1.0, cgroup_root=self._cgroup_root)
            raise LaunchFailed("JOURNAL_FAILED")
        if self._on_spawned is not None:
            try:
                self._on_spawned(request.run_id, request.attempt_id, handle)
            except Exception:
                log.exception("on_spawned callback failed")
        return Launched(handle, started_at_ms, running)

    @property
    def zygote_pid(self) -> int | None:
        """The pid of the running shim zygote, if any (tests and the bench)."""
        return self._zygote.pid if self._zygote is not None else None

    def close(self) -> None:
        """Stop the zygote (EOF; running shims and jobs are untouched)."""
        if self._zygote is not None:
            self._zygote.close()

    def _job_spec(self, run_as: str | None) -> dict[str, Any] | None:
        """The spec's ``job`` for a request (None: the service's own user); a ``run_as`` this
        worker was not configured for is refused, never run as someone else."""
        policy = self._job_policy
        if policy is None:
            if run_as is not None:
                raise LaunchFailed("RUN_AS_NOT_ALLOWED")
            return None
        try:
            return policy.spec(policy.user_for(run_as))
        except KeyError:
            raise LaunchFailed("RUN_AS_NOT_ALLOWED") from None

    def _spec(self, request: LaunchRequest, shard: Path, job: dict[str, Any] | None) -> bytes:
        fields = request.wire_fields()
        fields.pop("run_as", None)
        spec = {
            "protocol": PROTOCOL,
            **fields,
            "receipt_dir": str(shard),
            "receipt_name": receipt_name(request.attempt_id),
            "cgroup_root": None if self._cgroup_root is None else str(self._cgroup_root.path),
            **({} if job is None else {"job": job}),
            **({} if self._max_processes is None else {"max_processes": self._max_processes}),
            **self._spec_extra,
        }
        return json.dumps(spec, separators=(",", ":")).encode("utf-8")

    def _spawn(
        self, request: LaunchRequest, shard: Path, job: dict[str, Any] | None
    ) -> tuple[ProcessHandle, int]:
        spec = self._spec(request, shard, job)
        started = self._start_zygote(request, spec) if self._zygote is not None else None
        if started is None:
            started = self._start_exec(request, spec)
        status: dict[str, Any] | None = None
        try:
            status = read_status(started.status_fd, started.deadline)
            ok = status.get("ok") is True
            handle = _handle_from_status(status, request.attempt_id) if ok else None
        except (OSError, ValueError):
            handle = None
        finally:
            os.close(started.status_fd)
        if handle is None:
            # Everything the shim may have started shares its session: kill it while the
            # unreaped first shim process still pins the session id, then reap.
            if started.session is not None:
                _kill_session(started.session)
            else:
                log.warning("shim session unknown (zygote lost mid-launch); nothing killed")
            self._end_cgroup(request.attempt_id)
            started.reap()
            self._journal.record_spawn_failed(attempt_id=request.attempt_id)
            reason, errno_name = "SHIM_NO_STATUS", None
            if status is not None and status.get("ok") is False:
                error = status.get("error")
                reason = error if isinstance(error, str) and error.isupper() else "SHIM_FAILED"
                errno_name = _errno_name(status.get("errno"))
            raise LaunchFailed(reason, errno_name)
        started.reap()
        return handle, int(status["started_at_ms"]) if status else 0

    def _end_cgroup(self, attempt_id: str) -> None:
        """A failed launch leaves no job cgroup (the shim may have made one before it died)."""
        path = (
            None
            if self._cgroup_root is None
            else self._cgroup_root.job_dir(CGROUP_PREFIX + attempt_id)
        )
        if path is not None:
            settle(path, patience=0.0, timeout=_CGROUP_END_S)

    def _start_zygote(self, request: LaunchRequest, spec: bytes) -> _Started | None:
        """Fork the shim from the zygote; None means: use the one-shot interpreter."""
        assert self._zygote is not None
        zygote = self._zygote
        read_fd, write_fd = os.pipe()
        session: int | None = None
        try:
            try:
                session = zygote.spawn(spec, write_fd)
            except NotReceived:
                # Certainly not received, so nothing can start twice: restart once, retry.
                session = zygote.spawn(spec, write_fd, restart=True)
        except (ZygoteUnavailable, NotReceived):
            os.close(read_fd)
            return None
        except ForkFailed:
            os.close(read_fd)
            self._journal.record_spawn_failed(attempt_id=request.attempt_id)
            raise LaunchFailed("SHIM_SPAWN_FAILED") from None
        except Uncertain:
            pass  # it may have forked: the status pipe tells (EOF once every writer is gone)
        finally:
            os.close(write_fd)
        pid = session

        def reap() -> None:
            if pid is not None:
                zygote.release(pid)

        return _Started(read_fd, session, reap, time.monotonic() + self._status_timeout_s)

    def _start_exec(self, request: LaunchRequest, spec: bytes) -> _Started:
        """A fresh shim (``SHIM_BOOT``), spec on stdin, status on stdout."""
        try:
            proc = subprocess.Popen(
                self._argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={},  # the shim needs nothing from the service environment
                close_fds=True,
                start_new_session=True,
            )
        except OSError:
            self._journal.record_spawn_failed(attempt_id=request.attempt_id)
            raise LaunchFailed("SHIM_SPAWN_FAILED") from None
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(spec)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the shim died early; its status (if any) still tells why
        status_fd = os.dup(proc.stdout.fileno())
        proc.stdout.close()
        deadline = time.monotonic() + self._status_timeout_s
        return _Started(status_fd, proc.pid, lambda: _reap(proc), deadline)


def read_status(fd: int, deadline: float) -> dict[str, Any]:
    """The one status line from ``fd``, bounded by ``deadline`` (ValueError past it, on EOF
    before a line, or on a line that is not a JSON object)."""
    buf = b""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ValueError("no status line in time")
        waiter = select.poll()  # any descriptor number: select() refuses one past 1023
        waiter.register(fd, select.POLLIN)
        if not waiter.poll(remaining * 1000):
            continue
        chunk = os.read(fd, STATUS_MAX_BYTES)
        if not chunk:
            raise ValueError("status channel closed")
        buf += chunk
        if len(buf) > STATUS_MAX_BYTES:
            raise ValueError("status line too long")
    status = json.loads(buf.split(b"\n", 1)[0])
    if not isinstance(status, dict):
        raise ValueError("status is not an object")
    return status


def _errno_name(value: object) -> str | None:
    """The symbolic name of an errno the shim reported ("ENOENT"), or None."""
    if type(value) is not int:
        return None
    return errno.errorcode.get(value)


def _handle_from_status(status: dict[str, Any], attempt_id: str) -> ProcessHandle | None:
    cgroup = status.get("cgroup")
    if cgroup is not None and cgroup != CGROUP_PREFIX + attempt_id:
        return None  # a job cgroup is only ever the one derived from this attempt's id
    for key in _STATUS_INT_KEYS:
        value = status.get(key)
        if type(value) is not int or value <= 0:
            return None
    boot_id = status.get("boot_id")
    if not isinstance(boot_id, str) or boot_id != current_boot_id():
        return None
    if status["pgid"] != status["pid"]:
        return None  # the job must lead its own process group (stop signals the group)
    return ProcessHandle(
        boot_id=boot_id,
        pid=status["pid"],
        pgid=status["pgid"],
        start_ticks=status["start_ticks"],
        shim_pid=status["shim_pid"],
        shim_start_ticks=status["shim_start_ticks"],
        cgroup=cgroup,
    )


def _session_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    return None if fields is None else int(fields[3])  # field 6: session id


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (the shim, and a job it may have started).

    Each member is pinned by a pidfd and re-checked after opening it, so a pid reused by an
    unrelated process between the /proc scan and the signal is never hit.
    """
    for _ in range(3):  # a forking process may add members while we look
        members = [
            int(n) for n in os.listdir("/proc") if n.isdigit() and _session_of(int(n)) == sid
        ]
        if not members:
            return
        for pid in members:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if _session_of(pid) == sid:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                os.close(pidfd)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=DEFAULT_STATUS_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # pragma: no cover - the first shim process never lingers
        proc.kill()
        proc.wait()


def stop_handle(
    handle: ProcessHandle, *, grace_seconds: float, cgroup_root: CgroupRoot | None
) -> StopResult:
    """Exact-identity stop of a handle's job, with its own cgroup when it has one here."""
    identity = ProcessIdentity.of_job(handle)
    cgroup = None if cgroup_root is None else cgroup_root.job_dir(handle.cgroup)
    return stop_identity(identity, grace_seconds=grace_seconds, cgroup=cgroup)


class IdentityController:
    """The ProcessController port: stop the job's exact identity (docs/design.md §3.10)."""

    def __init__(self, *, cgroup_root: CgroupRoot | None = None) -> None:
        self._cgroup_root = cgroup_root

    def stop(self, handle: ProcessHandle, *, grace_seconds: float) -> StopResult:
        """TERM, bounded grace, identity re-check, KILL; never signal a mismatched identity."""
        return stop_handle(handle, grace_seconds=grace_seconds, cgroup_root=self._cgroup_root)
