"""Per-job shim: start one user process, keep its output under quota, publish its receipt.

Run as a script, never imported by the service. The worker starts it with ``shim_argv()``
(``app/worker/launcher.py``), which runs this file as ``__main__`` exactly as

    [sys.executable, "-I", "-S", "/abs/path/app/worker/shim.py"]

would, but from its cached bytecode (launch-protocol.md §1).

Standard library only; imports nothing from ``app``. The protocol (spec on stdin, one
status line on stdout, log, truncation fact, completion receipt) is specified in
``api-schemas/launch-protocol.md``; keep the two in step.
"""

from __future__ import annotations

# The private C halves of ``json`` and ``signal``: the public modules pull in ``re`` and
# ``enum`` and would roughly double the shim's start-up time.
import _json
import _signal as signal  # type: ignore[import-not-found]
import errno
import os
import select
import sys
import time

TYPE_CHECKING = False  # ``typing`` itself costs start-up time (it imports ``re``)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

PROTOCOL = 1
SPEC_MAX_BYTES = 1 << 20
READ_CHUNK = 64 * 1024
# The most of a log's quota kept for the output's last bytes (a ring in memory while the job
# runs, appended after the head when it ends): a quarter of the quota up to this.
LOG_TAIL_MAX_BYTES = 64 * 1024
# After the job itself has exited, descendants may still hold the pipe open: keep
# draining for at most this long, then close the read end and publish the receipt.
POST_EXIT_DRAIN_SECONDS = 1.0
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# How the job's child reports a failure between fork and exec: "CODE errno" on a pipe.
_CHILD_FAILED = 127
# The receipt's 4 KiB limit (docs/design.md §3.11): its temp file holds this much before the job
# starts, so publishing rewrites allocated space in place and a full disk cannot refuse it.
RECEIPT_RESERVE_BYTES = 4096
# Publication refused (ENOSPC, EROFS, EIO ...): try again, backing off up to the cap, for as
# long as the shim lives. The ending stays here meanwhile and the attempt stays running.
PUBLISH_RETRY_FIRST_S = 0.05
PUBLISH_RETRY_MAX_S = 5.0
# "no_clone3": start the job the fallback way (enter the cgroup, spawn, leave), for tests.
# "stop_after_reserve_link": SIGSTOP between linking a spare's reservation and removing the
# spare's own name (a test SIGKILLs it there).
TEST_HOOKS = (
    "exit_before_receipt", "exit_after_temp_write", "stop_after_temp_write", "no_clone3",
    "stop_after_reserve_link", "stall_home_removal",
)  # fmt: skip
# After the job's main process ended (leftovers "kill"): how long the shim waits for the rest
# of the job to die before it gives up and publishes anyway (docs/leftovers.md).
LEFTOVER_WAIT_SECONDS = 2.0
LEFTOVER_POLL_SECONDS = 0.005
CGROUP_PREFIX = "ql-"
# clone3(2) with CLONE_INTO_CGROUP (Linux >= 5.7): the job is born in its cgroup without the
# shim migrating there and back (each cgroup.procs write waits out an RCU grace period).
# 435 is clone3 on these machines only (asm-generic numbering and x86_64 alike).
SYS_CLONE3 = 435
CLONE3_MACHINES = ("x86_64", "aarch64")
CLONE_INTO_CGROUP = 0x200000000
_CLONE_ARGS_WORDS = 11  # struct clone_args up to .cgroup (CLONE_ARGS_SIZE_VER2, 88 bytes)
LEFTOVERS = ("kill", "keep")
MAX_PROCESSES_MOST = 4_194_304  # pid_max's ceiling (the worker's setting allows no more)
HOOK_EXIT_CODE = 70
_SPEC_KEYS = frozenset(
    {
        "protocol",
        "run_id",
        "attempt_id",
        "callback_sequence",
        "token",
        "argv",
        "cwd",
        "env",
        "log_path",
        "log_quota_bytes",
        "receipt_dir",
        "receipt_name",
        "leftovers",
        "cgroup_root",
    }
)


class ShimError(Exception):
    """A launch failure reported on the status line (stable code, errno, nothing else)."""

    def __init__(self, code: str, errno: int | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.errno = errno


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _ScanContext:
    """What ``_json.make_scanner`` reads: strict JSON, plain dicts, no NaN/Infinity."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(_name: str) -> Any:
        raise ValueError("non-finite number")


def _loads(text: str) -> Any:
    """Parse exactly one JSON document (surrounding JSON whitespace allowed)."""
    text = text.strip(" \t\n\r")
    try:
        value, end = _json.make_scanner(_ScanContext())(text, 0)  # type: ignore[arg-type]
    except Exception:  # StopIteration, or whatever the C scanner raises for bad input
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("trailing data")
    return value


def _dumps(value: object) -> str:
    """Canonical JSON (sorted keys, "," and ":") of dicts, lists, str, int, bool, None."""
    if isinstance(value, str):
        return str(_json.encode_basestring(value))
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if type(value) is int:
        return str(value)
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(_dumps(k) + ":" + _dumps(v) for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dumps(v) for v in value) + "]"
    raise TypeError("unsupported value")


def _canonical(value: dict[str, Any]) -> bytes:
    return _dumps(value).encode("utf-8")


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _status(status_fd: int, payload: dict[str, Any]) -> None:
    """Write the one status line to ``status_fd``, then detach from the worker's fds."""
    try:  # noqa: SIM105 (contextlib would be one more import in the shim)
        _write_all(status_fd, _canonical(payload) + b"\n")
    except OSError:
        pass  # the worker is gone: the job still runs and the receipt is still published
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)
    if status_fd > 2:
        os.close(status_fd)


def _fail(status_fd: int, code: str, errno: int | None = None) -> NoReturn:
    _status(status_fd, {"ok": False, "error": code, "errno": errno})
    _exit_unused(1)


def _is_int(value: object) -> bool:
    return type(value) is int


def _clean_str(value: object) -> bool:
    return isinstance(value, str) and "\x00" not in value


def _abs_path(value: object) -> bool:
    return _clean_str(value) and os.path.isabs(value)  # type: ignore[arg-type]


def _validate(spec: object) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ShimError("SPEC_INVALID")
    keys = set(spec)
    hook = spec.get("test_hook")
    optional = {"test_hook", "job", "max_processes"}
    if keys - optional != _SPEC_KEYS or (hook is not None and hook not in TEST_HOOKS):
        raise ShimError("SPEC_INVALID")
    if not _valid_job(spec.get("job")):
        raise ShimError("SPEC_INVALID")
    most = spec.get("max_processes")
    if most is not None and not (_is_int(most) and 1 <= most <= MAX_PROCESSES_MOST):
        raise ShimError("SPEC_INVALID")
    argv, env, cwd = spec["argv"], spec["env"], spec["cwd"]
    ok = (
        spec["protocol"] == PROTOCOL
        and _is_int(spec["protocol"])
        and all(_clean_str(spec[k]) and spec[k] for k in ("run_id", "attempt_id", "token"))
        and _is_int(spec["callback_sequence"])
        and spec["callback_sequence"] >= 1
        and isinstance(argv, list)
        and len(argv) >= 1
        and all(_clean_str(a) for a in argv)
        and argv[0] != ""
        and (cwd is None or (_clean_str(cwd) and os.path.isabs(cwd)))
        and isinstance(env, dict)
        and all(_clean_str(k) and k and "=" not in k and _clean_str(v) for k, v in env.items())
        and _clean_str(spec["log_path"])
        and os.path.isabs(spec["log_path"])
        and _is_int(spec["log_quota_bytes"])
        and spec["log_quota_bytes"] >= 0
        and _clean_str(spec["receipt_dir"])
        and os.path.isabs(spec["receipt_dir"])
        and spec["receipt_name"] == f"{spec['attempt_id']}.json"
        and "/" not in spec["receipt_name"]
        and spec["leftovers"] in LEFTOVERS
        and (spec["cgroup_root"] is None or _abs_path(spec["cgroup_root"]))
    )
    if not ok:
        raise ShimError("SPEC_INVALID")
    return spec


def _valid_job(job: object) -> bool:
    """The optional ``job`` object: who the job runs as (launch-protocol.md §2)."""
    if job is None:
        return True
    if not isinstance(job, dict) or set(job) != {"uid", "gid", "umask", "home", "home_root"}:
        return False
    return (
        all(_is_int(job[k]) and job[k] > 0 for k in ("uid", "gid"))
        and _is_int(job["umask"])
        and 0 <= job["umask"] <= 0o777
        and (job["home"] is None or _abs_path(job["home"]))
        and _abs_path(job["home_root"])
    )


def _read_stdin() -> bytes:
    """The spec bytes from fd 0 up to EOF (at most one byte over the limit is kept)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(0, READ_CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if total > SPEC_MAX_BYTES:
            raise ShimError("SPEC_INVALID")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_spec(raw: bytes) -> dict[str, Any]:
    if len(raw) > SPEC_MAX_BYTES:
        raise ShimError("SPEC_INVALID")
    try:
        spec = _loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ShimError("SPEC_INVALID") from None
    return _validate(spec)


def _stat(pid: int) -> list[bytes]:
    """/proc/<pid>/stat fields after the comm, which may hold ')' and spaces (0 state, 1 ppid,
    2 pgid = field 5, 19 start ticks = field 22); OSError when there is no such process."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    return data[data.rindex(b")") + 2 :].split()


def _proc_stat(pid: int) -> tuple[int, int]:
    """(pgid, start_ticks) of ``pid``."""
    fields = _stat(pid)
    return int(fields[2]), int(fields[19])


_BOOT_ID: list[str] = []  # read once: a zygote's children share the zygote's copy


def _boot_id() -> str:
    if not _BOOT_ID:
        # Bytes, then decode: a text-mode open imports the ``encodings.ascii`` module.
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
            _BOOT_ID.append(fh.read().strip().decode("ascii"))
    return _BOOT_ID[0]


_PRCTL: list[Any] = []  # resolved once: the zygote resolves it before it forks anyone


def _prctl() -> Any:
    """``prctl(2)`` through the C half of ctypes only, or None where it cannot be had.

    The ``ctypes`` package costs a large share of the shim's own start-up for this one call;
    even ``_ctypes`` with its ``dlopen`` of libffi cost a measurable part of every shim until
    the zygote took it on (figures: bench/README.md).
    """
    if not _PRCTL:
        try:
            import _ctypes

            class _CInt(_ctypes._SimpleCData):  # type: ignore[type-arg]
                _type_ = "i"

            class _Prctl(_ctypes.CFuncPtr):
                _flags_ = _ctypes.FUNCFLAG_CDECL
                _restype_ = _CInt

            _PRCTL.append(_Prctl(_ctypes.dlsym(_ctypes.dlopen(None), "prctl")))  # type: ignore[arg-type]
        except (OSError, AttributeError, ImportError, TypeError):
            _PRCTL.append(None)
    return _PRCTL[0]


_CAPSET: list[Any] = []  # like prctl: resolved once, in the zygote before it forks


def _capset() -> Any:
    """``capset(2)`` with its two arguments as ctypes arrays, or None where it cannot be had."""
    if not _CAPSET:
        try:
            import _ctypes

            class _CInt(_ctypes._SimpleCData):  # type: ignore[type-arg]
                _type_ = "i"

            class _U32(_ctypes._SimpleCData):  # type: ignore[type-arg]
                _type_ = "I"

            class _Words(_ctypes.Array):  # type: ignore[type-arg]
                _type_ = _U32
                _length_ = 8  # header (version, pid) or data (2 x effective, permitted, inh.)

            class _Capset(_ctypes.CFuncPtr):
                _flags_ = _ctypes.FUNCFLAG_CDECL
                _restype_ = _CInt

            func = _Capset(_ctypes.dlsym(_ctypes.dlopen(None), "capset"))  # type: ignore[arg-type]
            _CAPSET.append((func, _Words))
        except (OSError, AttributeError, ImportError, TypeError):
            _CAPSET.append(None)
    return _CAPSET[0]


class _Clone3Refused(Exception):
    """clone3 did not start a child (old kernel, seccomp, refused flag or cgroup): the caller
    falls back to migrating the shim. Not an OSError, so a fork failure is not mistaken for it."""


_CLONE3: list[Any] = []  # like prctl: resolved once, in the zygote before it forks


def _clone3() -> Any:
    """``fork_into(dir_fd)``: clone3(CLONE_INTO_CGROUP) through ``syscall(3)``, fork semantics
    (0 in the child, the pid in the parent) with the child born in the cgroup of ``dir_fd``;
    raises _Clone3Refused when no child was made. None where it cannot be had at all."""
    if not _CLONE3:
        try:
            if sys.platform != "linux" or os.uname().machine not in CLONE3_MACHINES:
                raise ImportError("clone3 is not syscall 435 here")
            import _ctypes

            class _CLong(_ctypes._SimpleCData):  # type: ignore[type-arg]
                _type_ = "l"

            class _U64(_ctypes._SimpleCData):  # type: ignore[type-arg]
                _type_ = "Q"

            class _Args(_ctypes.Array):  # type: ignore[type-arg]
                _type_ = _U64
                _length_ = _CLONE_ARGS_WORDS

            class _Syscall(_ctypes.CFuncPtr):
                _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
                _restype_ = _CLong

            func = _Syscall(_ctypes.dlsym(_ctypes.dlopen(None), "syscall"))  # type: ignore[arg-type]
            number, size = _CLong(SYS_CLONE3), _CLong(_CLONE_ARGS_WORDS * 8)
            get_errno = _ctypes.get_errno

            def fork_into(dir_fd: int) -> int:
                args = _Args()
                args[0] = CLONE_INTO_CGROUP  # flags; pidfd, child_tid, parent_tid unused
                args[4] = signal.SIGCHLD  # exit_signal: a plain child, as fork() makes
                args[10] = dir_fd  # cgroup; stack, tls, set_tid stay 0 (fork semantics)
                pid = func(number, args, size)
                if pid < 0:
                    raise _Clone3Refused(get_errno())
                return int(pid)

            _CLONE3.append(fork_into)
        except (OSError, AttributeError, ImportError, TypeError):
            _CLONE3.append(None)
    return _CLONE3[0]


def _single_threaded() -> bool:
    """The raw clone3 child skips CPython's after-fork hooks: only safe with no other thread."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _set_dumpable_off() -> None:
    """No core dump, and /proc/<shim>/fd, environ, mem become root's: a job of another user
    cannot look into the shim's open files (the log, the receipt directory)."""
    prctl = _prctl()
    if prctl is not None:
        try:  # noqa: SIM105
            prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        except (OSError, TypeError):
            pass


def _capabilities_left() -> bool:
    """True while this process still has any capability in any set but the bounding one."""
    with open("/proc/self/status", "rb") as fh:
        for line in fh.read().split(b"\n"):
            if line[:6] in (b"CapInh", b"CapPrm", b"CapEff", b"CapAmb") and int(line[8:], 16):
                return True
    return False


def _drop_capabilities() -> None:
    """Leave no capability that survives ``execve``: the ambient set (a non-root service with
    ambient CAP_SETUID would otherwise hand it to the job, which could switch back) and the
    inheritable set. Root's sets were already cleared by setuid to a non-zero uid. Checked
    afterwards: OSError when anything is left, and the job is not started."""
    prctl = _prctl()
    if prctl is not None:
        try:  # noqa: SIM105
            prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        except (OSError, TypeError):
            pass
    capset = _capset()
    if capset is not None:
        func, words = capset
        header, data = words(), words()
        header[0] = _LINUX_CAPABILITY_VERSION_3
        try:  # noqa: SIM105
            func(header, data)  # all zero: lowering is always permitted
        except (OSError, TypeError):
            pass
    if _capabilities_left():
        raise OSError(errno.EPERM, "capabilities left")


def _become(job: dict[str, Any]) -> None:
    """Switch this (forked) process to the job user: no supplementary groups, its primary
    group, its uid in all three slots, no capabilities left."""
    os.setgroups([])
    os.setresgid(job["gid"], job["gid"], job["gid"])
    os.setresuid(job["uid"], job["uid"], job["uid"])
    if os.getuid() != job["uid"] or os.getgid() != job["gid"] or os.getgroups():
        raise OSError(errno.EPERM, "identity not switched")
    _drop_capabilities()


_SETRLIMIT: list[Any] = []  # like prctl: resolved once, in the zygote before it forks


def _setrlimit() -> Any:
    """``resource``'s (getrlimit, setrlimit, RLIMIT_NPROC), or None where it cannot be had.
    Imported only by a shim that lowers a job's limit, or once by the zygote."""
    if not _SETRLIMIT:
        try:
            import resource

            _SETRLIMIT.append((resource.getrlimit, resource.setrlimit, resource.RLIMIT_NPROC))
        except (ImportError, AttributeError):
            _SETRLIMIT.append(None)
    return _SETRLIMIT[0]


def _limit_nproc(most: int) -> None:
    """In the job, after the switch to the job user: at most ``most`` processes and threads
    of that user (soft and hard, never above the inherited hard limit). The kernel counts
    every process of the real uid, across that user's jobs; refused forks get EAGAIN."""
    calls = _setrlimit()
    if calls is None:
        raise OSError(errno.ENOSYS, "no setrlimit")
    getrlimit, setrlimit, which = calls
    _soft, hard = getrlimit(which)
    if hard >= 0:  # RLIM_INFINITY is -1 here
        most = min(most, hard)
    setrlimit(which, (most, most))


def _limit_pids(cgroup: str, most: int | None) -> bool:
    """Write ``most`` into the job cgroup's ``pids.max``; False when there is none (the pids
    controller is not enabled for job cgroups) or the write is refused."""
    if most is None:
        return False
    try:
        _cgroup_write(cgroup + "/pids.max", str(most).encode("ascii"))
    except OSError:
        return False
    return True


def _nproc(spec: dict[str, Any], pids_held: bool) -> int | None:
    """The RLIMIT_NPROC to set in the job: the spec's limit when its cgroup's pids.max does
    not hold it and the job runs as a job user (never the shim's own user: the limit would
    count the service's processes too); else None."""
    if pids_held or spec.get("job") is None:
        return None
    most: int | None = spec.get("max_processes")
    return most


def _set_subreaper() -> None:
    prctl = _prctl()
    if prctl is not None:
        try:  # noqa: SIM105 - contextlib is start-up time the shim does not spend
            prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, TypeError):
            pass  # best effort: orphaned grandchildren then go to init instead


def _resolve(argv0: str, env: dict[str, str]) -> str:
    """The executable to spawn: a path as given, else the first PATH (of the job env) hit."""
    if "/" in argv0:
        return argv0
    for directory in os.get_exec_path(env):
        candidate = os.path.join(directory, argv0)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ShimError("EXEC_FAILED", 2)  # ENOENT


def _spawn(
    spec: dict[str, Any], write_fd: int, home: str | None = None, nproc: int | None = None
) -> int:
    if spec.get("job") is not None:  # fork, switch to the job user, exec
        return _fork_exec(spec, write_fd, home, os.fork, nproc)
    cwd = spec["cwd"] or "/"
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise ShimError("CWD_INVALID", exc.errno) from None
    try:
        path = _resolve(spec["argv"][0], spec["env"])
        sigdef = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
        return os.posix_spawn(
            path,
            spec["argv"],
            spec["env"],
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, write_fd, 1),
                (os.POSIX_SPAWN_DUP2, write_fd, 2),
            ],
            setpgroup=0,
            setsigmask=(),
            setsigdef=sigdef,
        )
    except OSError as exc:
        raise ShimError("EXEC_FAILED", exc.errno) from None
    except ValueError:
        raise ShimError("SPEC_INVALID") from None
    finally:
        os.chdir("/")


def _spawn_into(
    spec: dict[str, Any], write_fd: int, home: str | None, cgroup: str, nproc: int | None = None
) -> int | None:
    """Start the job born in ``cgroup`` by clone3(CLONE_INTO_CGROUP), the shim staying where
    it is; None when that cannot be had here (the caller migrates the shim instead)."""
    fork_into = _clone3()
    if fork_into is None or spec.get("test_hook") == "no_clone3" or not _single_threaded():
        return None
    try:
        dir_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _fork_exec(spec, write_fd, home, lambda: fork_into(dir_fd), nproc)
    except _Clone3Refused:
        return None
    finally:
        os.close(dir_fd)


def _job_env(spec: dict[str, Any], home: str | None) -> dict[str, str]:
    """Exactly the spec's env; with a job user, HOME set (configured or per-job) unless named."""
    env: dict[str, str] = spec["env"]
    job = spec.get("job")
    if job is None:
        return env
    env = dict(env)
    if job["home"] is not None:
        env.setdefault("HOME", job["home"])
    elif home is not None:
        env.setdefault("HOME", home)
    return env


def _kept_by_exec() -> list[int]:
    """The signals whose disposition ``execve`` would keep and the job must not inherit:
    ignored ones, and any Python does not know (None: set outside Python, maybe ignored).
    A caught signal is reset to its default by ``execve`` itself."""
    kept = []
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            handler = signal.getsignal(sig)
            if handler is None or handler == signal.SIG_IGN:
                kept.append(sig)
    return kept


def _fork_exec(
    spec: dict[str, Any],
    write_fd: int,
    home: str | None,
    fork: Callable[[], int],
    nproc: int | None = None,
) -> int:
    """Start the job with ``fork`` (``os.fork`` or clone3 into the job's cgroup) and ``execve``;
    a failure before ``execve`` comes back on a close-on-exec pipe as "CODE errno" (EOF alone
    means the exec happened). An exception from ``fork`` other than OSError is passed on.

    The same file actions as ``posix_spawn`` (stdin /dev/null, stdout and stderr the pipe,
    own process group, default signals, empty mask, ``cwd``, the executable looked up in the
    job env's PATH). With a job user, also: identity, umask, the job's HOME created as the job
    user, ``cwd`` and the lookup as the job user; with ``nproc``, RLIMIT_NPROC lowered after
    the switch (set before it, the switch itself would mark a user already at the limit and
    its ``execve`` would fail: the job must start and see its forks refused instead). The
    child runs only the statements below (the shim is single-threaded) and always ends in
    ``execve`` or ``os._exit``.
    """
    job = spec.get("job")
    if nproc is not None:
        _setrlimit()  # the import happens here, in the shim, never in the forked child
    env = _job_env(spec, home)
    resets = _kept_by_exec()
    err_r, err_w = os.pipe()
    try:
        pid = fork()
    except BaseException as exc:
        os.close(err_r)
        os.close(err_w)
        if isinstance(exc, OSError):
            raise ShimError("EXEC_FAILED", exc.errno) from None
        raise
    if pid == 0:
        code, err = ("EXEC_FAILED" if job is None else "JOB_USER_FAILED"), 0
        try:
            os.close(err_r)
            os.setpgid(0, 0)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(write_fd, 1)
            os.dup2(write_fd, 2)
            if null > 2:
                os.close(null)
            for sig in resets:
                try:  # noqa: SIM105
                    signal.signal(sig, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass  # signals the C library keeps for itself
            if job is not None:
                _become(job)
                if nproc is not None:
                    _limit_nproc(nproc)
                os.umask(job["umask"])
                if home is not None and env.get("HOME") == home:
                    code = "HOME_FAILED"
                    os.mkdir(home, 0o700)
            code = "CWD_INVALID"
            os.chdir(spec["cwd"] or "/")
            code = "EXEC_FAILED"
            path = _resolve(spec["argv"][0], env)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            os.execve(path, spec["argv"], env)  # noqa: S606 - argv as given, never a shell
        except ShimError as exc:
            code, err = exc.code, exc.errno or 0
        except OSError as exc:
            err = exc.errno or 0
        except BaseException:  # noqa: S110 - whatever it was, the job must not run
            pass
        try:
            _write_all(err_w, f"{code} {err}".encode("ascii"))
        finally:
            os._exit(_CHILD_FAILED)
    os.close(err_w)
    report = b""
    while True:
        chunk = os.read(err_r, 256)
        if not chunk:
            break
        report += chunk
    os.close(err_r)
    if report:
        os.waitpid(pid, 0)
        word, _, digits = report.decode("ascii", "replace").partition(" ")
        number = int(digits) if digits.isdigit() else None
        raise ShimError(word if word.isupper() else "EXEC_FAILED", number)
    return pid


def _job_home(spec: dict[str, Any]) -> str | None:
    """The per-job HOME to create (None: the configured one, or no job user)."""
    job = spec.get("job")
    if job is None or job["home"] is not None:
        return None
    return f"{job['home_root']}/ql-home-{spec['attempt_id']}-{os.urandom(6).hex()}"


_HOME_REMOVAL_S = 120.0  # then the remover's alarm ends it, and what is left of the HOME stays
_HOME_WAIT_S = 1.0  # how long the shim waits for the remover before it goes on without it


def _names(fd: int) -> list[str]:
    try:
        with os.scandir(fd) as entries:
            return [entry.name for entry in entries]
    except OSError:
        return []


def _remove_entry(dir_fd: int, name: str) -> None:
    """Remove ``name`` under ``dir_fd`` and all below it, never following a symlink.

    Iterative, one fd per level (a job may nest directories deeper than any recursion
    limit): a depth the fd limit cannot hold is left, as is whatever cannot be removed.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        try:  # noqa: SIM105
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
        return
    stack = [(dir_fd, name, fd, _names(fd))]
    while stack:
        parent, here, fd, names = stack[-1]
        if names:
            child = names.pop()
            try:
                below = os.open(child, flags, dir_fd=fd)
            except OSError:  # not a directory (or one it cannot open): unlink it
                try:  # noqa: SIM105
                    os.unlink(child, dir_fd=fd)
                except OSError:
                    pass
                continue
            stack.append((fd, child, below, _names(below)))
            continue
        stack.pop()
        os.close(fd)
        try:  # noqa: SIM105
            os.rmdir(here, dir_fd=parent)
        except OSError:
            pass


def _remove_home(job: dict[str, Any], home: str, hook: str | None = None) -> None:
    """Remove the per-job HOME as the job user, in a forked child (the shim never needs
    rights over the job's files). The shim waits for it ``_HOME_WAIT_S`` at most: the usual
    HOME is gone in a millisecond, before the ending is recorded (at the shim's exit, or its
    failure line); a large one, or a remover another job of the same user stopped (SIGSTOP),
    must not delay the ending longer. Past that the remover goes on alone, in a session of
    its own (no group kill meant for others reaches it), until its own alarm after
    ``_HOME_REMOVAL_S``; an orphan, it is reaped by the supervisor or init."""
    try:
        pid = os.fork()
    except OSError:
        return
    if pid != 0:
        _wait_a_little(pid, _HOME_WAIT_S)
        return
    try:
        os.setsid()
        # Nothing of the shim's (the log and receipt directories, the worker's status pipe
        # on stdout) stays open in a process the job user owns.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        for entry in os.listdir("/proc/self/fd"):
            if int(entry) > 2:
                try:  # noqa: SIM105
                    os.close(int(entry))
                except OSError:
                    pass
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(_HOME_REMOVAL_S))  # the default action ends it then
        _raise_fd_limit()  # one fd per level of the tree; before the switch of user
        _become(job)
        if hook == "stall_home_removal":  # what another job of the user can do to it
            with open(f"{home}.remover-pid", "w") as said:
                said.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        parent, name = home.rsplit("/", 1)
        dir_fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        _remove_entry(dir_fd, name)
    finally:
        os._exit(0)


def _wait_a_little(pid: int, seconds: float) -> None:
    """Reap the child ``pid`` if it ends within ``seconds``; else leave it running."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    if pidfd >= 0:
        try:
            waiter = select.poll()  # any fd number, unlike select()
            waiter.register(pidfd, select.POLLIN)
            waiter.poll(int(seconds * 1000))  # readable once it exited
        except OSError:
            pass
        finally:
            os.close(pidfd)
    else:  # no pidfd (an old kernel): poll, at first often
        deadline, pause = time.monotonic() + seconds, 0.001
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    return
            except ChildProcessError:
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    try:  # noqa: SIM105
        os.waitpid(pid, os.WNOHANG)  # reaped if it ended; else it outlives the shim
    except ChildProcessError:
        pass


def _raise_fd_limit() -> None:
    """The soft limit of open files up to the hard one (a raise the job user keeps)."""
    try:
        import resource  # only the remover needs it, after the job ended

        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, OSError, ValueError):
        pass


def _tail_bytes(quota: int) -> int:
    """How much of a quota is kept for the output's end: a quarter, at most LOG_TAIL_MAX_BYTES
    (``app/domain/artifacts.py`` ``log_tail_bytes`` says the same; a test keeps them equal)."""
    return min(LOG_TAIL_MAX_BYTES, max(quota, 0) // 4)


class _Drain:
    """Copy the job's output into the log: its head up to the quota minus the tail, its last
    bytes in a ring written after the head when the job ends; count the bytes between.

    While the job runs the log only grows (followers and range reads rely on that). The ring
    is allocated at the first byte past the head, never before, and only ever holds what the
    quota has left (docs/disk-full-and-readiness.md, "A log over its quota keeps its head and
    its tail").
    """

    def __init__(self, log_fd: int, quota: int) -> None:
        self.log_fd = log_fd
        self.quota = quota
        self.used = os.fstat(log_fd).st_size
        self.head = max(quota - _tail_bytes(quota), 0)  # the log's size before the tail
        self.dropped = 0
        self.reason = "quota"  # why bytes were dropped: the quota unless a write failed
        self.failed = False  # a write failed: nothing more is written, the rest is dropped
        self.ring: bytearray | None = None
        self.ring_at = 0  # where the next byte goes in the ring
        self.past = 0  # bytes of output past the head (the ring keeps the last of them)
        self.gap_at: int | None = None  # the log's offset where dropped bytes were cut out
        self.buf = bytearray(READ_CHUNK)
        self.view = memoryview(self.buf)

    def _write(self, data: memoryview) -> int:
        """Append ``data``; the bytes written. A failure stops all writing for good: what
        reached the log counts as kept, the rest as dropped, and the reason says why."""
        written = 0
        try:
            while written < len(data):
                written += os.write(self.log_fd, data[written:])
        except OSError as exc:
            self.failed = True
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            self.reason = "disk_full" if full else "write_error"
        self.used += written
        if written < len(data):  # the log's end is not the output's end: the gap is there
            self.gap_at = self.used
        self.dropped += len(data) - written
        return written

    def read_once(self, fd: int) -> bool:
        """Read one chunk; False on EOF."""
        n = os.readv(fd, [self.buf])
        if n == 0:
            return False
        if self.failed:
            self.dropped += n
            return True
        keep = min(n, max(self.head - self.used, 0))
        if keep:
            written = self._write(self.view[:keep])
            if written < keep:
                self.dropped += n - keep
                return True
        if keep < n:
            self._to_ring(self.view[keep:n])
        return True

    def _to_ring(self, data: memoryview) -> None:
        if self.ring is None:
            self.ring = bytearray(max(self.quota - self.used, 0))
        size, n = len(self.ring), len(data)
        self.past += n
        # Through a memoryview: a bytearray's own slice assignment copies ``data`` into a
        # temporary bytearray first, which doubled the shim's memory for a chunk.
        with memoryview(self.ring) as ring:
            if n >= size:
                ring[:] = data[n - size :]
                self.ring_at = 0
                return
            first = min(n, size - self.ring_at)
            ring[self.ring_at : self.ring_at + first] = data[:first]
            ring[: n - first] = data[first:]
        self.ring_at = (self.ring_at + n) % size

    def finish(self) -> None:
        """After the job ended: append the ring (the output's last bytes) after the head.

        The bytes the ring lost are dropped at the head's end (``gap_at``). A write that fails
        here stops like any other: the log ends where it stopped, the reason says why, and
        ``gap_at`` moves to the log's end, since what the log ends with is no longer the
        output's end (after a ring that went round, its bytes past the head are from the
        middle of the output).
        """
        if self.ring is None:
            return
        view, self.ring = memoryview(self.ring), None
        size = len(view)
        if self.past > size:  # the ring went round: its oldest byte is at ring_at
            self.gap_at = self.used
            self.dropped += self.past - size
            parts = (view[self.ring_at :], view[: self.ring_at])
        else:
            parts = (view[: self.past], view[:0])
        for part in parts:
            if self.failed:
                self.dropped += len(part)
            else:
                self._write(part)


def _reap(job_pid: int, status: list[int]) -> None:
    """Reap every exited child (the job and adopted descendants); record the job's status."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == job_pid:
            status.append(st)


def _supervise(
    job_pid: int, read_fd: int, drain: _Drain, on_exit: Callable[[], None] | None
) -> int:
    """Drain output until the job exited and the pipe is at EOF (or the post-exit window ends).

    ``on_exit`` runs once, right after the job was reaped and before the post-exit drain, so
    leftovers it kills stop holding the pipe open.
    """
    pidfd = os.pidfd_open(job_pid)
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    status: list[int] = []
    eof = False
    drain_deadline: float | None = None
    while not eof:
        if status and drain_deadline is None:
            if on_exit is not None:
                on_exit()
                on_exit = None
            drain_deadline = time.monotonic() + POST_EXIT_DRAIN_SECONDS
            poller.unregister(pidfd)
        if drain_deadline is None:
            timeout_ms = None
        else:
            remaining = drain_deadline - time.monotonic()
            if remaining <= 0:
                break
            timeout_ms = max(int(remaining * 1000), 1)
        for fd, _events in poller.poll(timeout_ms):
            if fd == read_fd:
                eof = not drain.read_once(read_fd)
        _reap(job_pid, status)
    if not status:  # EOF came first: the job closed its output but has not exited yet
        poller.unregister(read_fd)  # readable for ever at EOF; the pidfd stays registered
    while not status:
        poller.poll()
        _reap(job_pid, status)
    os.close(pidfd)
    if on_exit is not None:
        on_exit()
    os.close(read_fd)  # a descendant still writing now gets EPIPE/SIGPIPE, never blocks
    _reap(job_pid, status)
    return status[0]


# ---- leftovers: what is left of the job once its main process ended -------------------
# (api-schemas/launch-protocol.md §3 steps 5 and 8; docs/leftovers.md). Every signal goes
# through a pidfd opened *before* the process was re-checked, never to a bare pid.


def _live_child_ticks(pid: int, parent: int) -> int | None:
    """The start ticks of ``pid`` if it is a live (not zombie) child of ``parent``."""
    try:
        fields = _stat(pid)
    except OSError:
        return None
    if fields[0] in (b"Z", b"X") or int(fields[1]) != parent:
        return None
    return int(fields[19])


def _kill_pinned(pid: int, still_ours: Callable[[int], bool]) -> bool:
    """SIGKILL ``pid`` through a pidfd, only if ``still_ours(pid)`` holds after it was pinned."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not still_ours(pid):
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


def _child_since(parent: int, ticks: int) -> Callable[[int], bool]:
    return lambda pid: _live_child_ticks(pid, parent) == ticks


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _kill_tree(deadline: float) -> int:
    """SIGKILL every remaining descendant; how many. Orphans re-parent to the shim (it is the
    subreaper), so killing its children round by round reaches the whole tree: the job's
    process group and whatever left it with ``setsid``."""
    me = os.getpid()
    killed: set[tuple[int, int]] = set()
    while True:
        _reap(0, [])
        if not _has_children() or time.monotonic() >= deadline:
            return len(killed)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            ticks = _live_child_ticks(pid, me)
            if ticks is not None and _kill_pinned(pid, _child_since(me, ticks)):
                killed.add((pid, ticks))
        time.sleep(LEFTOVER_POLL_SECONDS)


def _cgroup_write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _cgroup_pids(cgroup: str) -> list[int]:
    me = os.getpid()
    with open(cgroup + "/cgroup.procs", "rb") as fh:
        return [pid for pid in map(int, fh.read().split()) if pid != me]


def _in_cgroup(pid: int, name: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as fh:
            lines = fh.read().split(b"\n")
    except OSError:
        return False
    return any(line.startswith(b"0::") and line.endswith(b"/" + name) for line in lines)


def _make_cgroup(spec: dict[str, Any]) -> str | None:
    """Create the job's own cgroup, named after the attempt; None when there is no cgroup root
    or the cgroup cannot be had (the process tree is then the only net)."""
    root, attempt = spec["cgroup_root"], spec["attempt_id"]
    if root is None or spec["leftovers"] != "kill" or attempt.strip("0123456789abcdef-"):
        return None
    path: str = root + "/" + CGROUP_PREFIX + attempt
    try:
        os.mkdir(path, 0o755)
    except OSError:
        return None  # exists already (never ours to reuse) or not writable
    try:
        # Checked before use: still the directory just created, not a symlink planted since.
        if os.lstat(path).st_mode & 0o170000 == 0o040000:
            return path
    except OSError:
        pass
    _remove_cgroup(path)
    return None


def _enter_cgroup(path: str) -> bool:
    """The fallback where clone3 cannot start the job inside: move the shim into the job's
    cgroup so that the job is born there (False, and the cgroup removed, when refused)."""
    try:
        _cgroup_write(path + "/cgroup.procs", b"0")
    except OSError:
        _remove_cgroup(path)
        return False
    return True


def _leave_cgroup(spec: dict[str, Any]) -> bool:
    """Move the shim back to the cgroup root, so that killing the job's cgroup spares it."""
    try:
        _cgroup_write(spec["cgroup_root"] + "/cgroup.procs", b"0")
    except OSError:
        return False
    return True


def _remove_cgroup(path: str) -> None:
    try:  # noqa: SIM105
        os.rmdir(path)
    except OSError:
        pass  # still populated after the bounded wait: the worker's stop can remove it


def _kill_cgroup(cgroup: str, shim_inside: bool, deadline: float) -> int:
    """Kill every process in the job's cgroup and wait until it is empty; how many."""
    name = cgroup.rsplit("/", 1)[1].encode("ascii")

    def member(pid: int) -> bool:
        return _in_cgroup(pid, name)

    counted = 0
    killed: set[int] = set()
    try:
        pids = _cgroup_pids(cgroup)
        if pids and not shim_inside and os.path.exists(cgroup + "/cgroup.kill"):
            counted = len(pids)  # one atomic kill; a process forked meanwhile dies uncounted
            _cgroup_write(cgroup + "/cgroup.kill", b"1")
        while pids and time.monotonic() < deadline:
            if not counted:  # no cgroup.kill (Linux < 5.14), or the shim could not leave
                for pid in pids:
                    if pid not in killed and _kill_pinned(pid, member):
                        killed.add(pid)
            time.sleep(LEFTOVER_POLL_SECONDS)
            _reap(0, [])
            pids = _cgroup_pids(cgroup)
    except OSError:
        pass
    return counted or len(killed)


def _stop_leftovers(cgroup: str | None, shim_inside: bool) -> int:
    """After the main process ended: kill the rest of the job (cgroup, then process tree)."""
    deadline = time.monotonic() + LEFTOVER_WAIT_SECONDS
    stopped = 0 if cgroup is None else _kill_cgroup(cgroup, shim_inside, deadline)
    stopped += _kill_tree(deadline)
    if cgroup is not None and not shim_inside:
        _remove_cgroup(cgroup)
    return stopped


class _Ahead:
    """A receipt reservation a spare made before its spec came (§8): the shim's claim and the
    space, in the receipts root under a name of this spare's own, for ``_Published.adopt``."""

    def __init__(self, dir_fd: int, name: str, fd: int, claim: dict[str, Any]) -> None:
        self.dir_fd, self.name, self.fd, self.claim = dir_fd, name, fd, claim

    def take(self) -> int:
        """The file's fd, now the caller's; our name for it is removed."""
        fd, self.fd = self.fd, -1
        self.drop()
        return fd

    def drop(self) -> None:
        """Remove our name and close what is still ours (best effort: the worker sweeps a
        name left by a spare that died, ``ReceiptStore.sweep_spares``)."""
        if self.name and self.dir_fd >= 0:
            try:  # noqa: SIM105
                os.unlink(self.name, dir_fd=self.dir_fd)
            except OSError:
                pass
        self.name = ""
        for fd in (self.fd, self.dir_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.dir_fd = -1


def _claim() -> dict[str, Any]:
    """This shim's identity, the head of its receipt reservation (docs/reserved-launch.md)."""
    pid = os.getpid()
    return {"boot_id": _boot_id(), "shim_pid": pid, "shim_start_ticks": _proc_stat(pid)[1]}


def _reserve_ahead(root: str | None) -> _Ahead | None:
    """In a spare, before its spec: ``.spare-<pid>-<start ticks>.tmp`` in the receipts root,
    holding this shim's claim and the receipt's space, as ``_Published.reserve`` writes them,
    so that the launch links it instead of creating a file on its way (a file creation can
    cost most of a millisecond: figures in bench/README.md). None when there is no root or
    any step fails (the launch then reserves as usual)."""
    if root is None:
        return None
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(root, flags)
    except OSError:
        return None
    ahead = _Ahead(dir_fd, "", -1, {})
    try:
        ahead.claim = _claim()
        ahead.name = f".spare-{ahead.claim['shim_pid']}-{ahead.claim['shim_start_ticks']}.tmp"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        ahead.fd = os.open(ahead.name, flags, 0o600, dir_fd=dir_fd)
        head = _canonical(ahead.claim)
        _pwrite_all(ahead.fd, head + bytes(RECEIPT_RESERVE_BYTES - len(head)))
    except OSError:
        if ahead.fd < 0:
            ahead.name = ""  # not ours: never remove a name this spare did not create
        ahead.drop()
        return None
    return ahead


class _Published:
    """One file published by temp + ``link()`` (docs/design.md §3.11), one step at a time.

    The temp is ``.<name>.tmp``: derived from the attempt id alone, so the worker cleans a
    leftover through the journal (docs/design.md §3.11) without listing any directory. ``link()``
    never replaces: a final name that exists is left untouched. Each step may fail (a full
    disk) and ``publish`` is then called again: a step already done is not redone.
    """

    def __init__(self, dir_fd: int, name: str) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.tmp = f".{name}.tmp"
        self.fd = -1
        self.linked = False

    def reserve(self, size: int, head: bytes = b"") -> None:
        """Create the temp file holding ``size`` bytes, so the final write needs no new space.

        ``head`` (at most ``size`` bytes) is written first, the rest is zeros: the receipt's
        reservation carries the shim's own identity, so recovery can tell a live reserving
        shim from a dead one (docs/reserved-launch.md). O_EXCL is the claim: recovery takes
        the same name first to fence a launch that never reached a shim, and then this
        fails (RECEIPT_RESERVE_FAILED, no job).
        No fsync: write() already allocates (tmpfs, ext4's delayed allocation, xfs), and a
        power cut ends the shim anyway. A copy-on-write file system may still need space at
        publication; the retries cover that.
        """
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.fd = os.open(self.tmp, flags, 0o600, dir_fd=self.dir_fd)
        _pwrite_all(self.fd, head + bytes(size - len(head)))

    def adopt(self, ahead: _Ahead, hook: str | None = None) -> bool:
        """Take a reservation the spare made ahead (§8 "Reservation made ahead") under the temp
        name: ``link()`` never replaces, so, as with O_EXCL, a name already there (recovery's
        fence) refuses it (FileExistsError: RECEIPT_RESERVE_FAILED, no job). False when it
        cannot be linked here for another reason: then ``reserve`` makes one as usual. The
        spare's own name is removed either way."""
        try:
            os.link(ahead.name, self.tmp, src_dir_fd=ahead.dir_fd, dst_dir_fd=self.dir_fd,
                    follow_symlinks=False)  # fmt: skip
        except OSError as exc:
            ahead.drop()
            if isinstance(exc, FileExistsError):
                raise
            return False
        if hook == "stop_after_reserve_link":
            os.kill(os.getpid(), signal.SIGSTOP)  # the test SIGKILLs us right here
        try:  # the name linked is the file we hold (nothing swapped the spare's name)
            linked = os.stat(self.tmp, dir_fd=self.dir_fd, follow_symlinks=False)
            held = os.fstat(ahead.fd)
            same = (linked.st_dev, linked.st_ino) == (held.st_dev, held.st_ino)
        except OSError:
            same = False
        if not same:
            try:  # noqa: SIM105 - the name is ours (this link made it); contextlib costs start-up
                os.unlink(self.tmp, dir_fd=self.dir_fd)
            except OSError:
                pass
            ahead.drop()
            return False
        self.fd = ahead.take()
        return True

    def publish(self, body: bytes, hook: str | None = None) -> None:
        """Write ``body``, link it to the final name, drop the temp, fsync the directory."""
        if not self.linked:
            if self.fd < 0:
                self.reserve(0)
            _pwrite_all(self.fd, body)
            os.ftruncate(self.fd, len(body))
            os.fsync(self.fd)
            if hook == "exit_after_temp_write":
                os._exit(HOOK_EXIT_CODE)
            if hook == "stop_after_temp_write":
                os.kill(os.getpid(), signal.SIGSTOP)  # the test SIGKILLs us right here
            try:
                os.link(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd,
                        follow_symlinks=False)  # fmt: skip
            except FileExistsError:
                pass  # never overwrite a published file
            except FileNotFoundError:
                pass  # the journal settled the attempt and removed our temp: nothing to add
            self.linked = True
        try:  # noqa: SIM105
            os.unlink(self.tmp, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass  # an earlier try, or the worker's cleanup after the receipt was consumed
        os.fsync(self.dir_fd)
        self.close()

    def discard(self) -> None:
        """Remove our temp (a launch that failed before the job started).

        Only one this shim created: a reservation refused with EEXIST found recovery's fence
        (or another claim) under that name, which must stay.
        """
        if self.fd < 0:
            return
        try:  # noqa: SIM105
            os.unlink(self.tmp, dir_fd=self.dir_fd)
        except OSError:
            pass  # the journal's cleanup removes it later
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _pwrite_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)


def _until_done(step: Any, *args: Any) -> None:
    """Call ``step(*args)`` until it raises no OSError, backing off up to the cap."""
    delay = PUBLISH_RETRY_FIRST_S
    while True:
        try:
            step(*args)
            return
        except OSError:
            time.sleep(delay)
            delay = min(delay * 2, PUBLISH_RETRY_MAX_S)


def _publish_truncation(log_dir_fd: int, log_name: str, drain: _Drain, quota: int) -> None:
    """The one-time, content-free truncation fact beside the log, published like a receipt.

    Never empty: it becomes visible under its final name only once complete (temp + link),
    and a fact already there is never overwritten. Retried like the receipt, which follows
    it: the completion transaction reads the fact when it consumes the receipt.
    """
    fact = {
        "droppedBytes": drain.dropped,
        "gapAt": drain.gap_at,
        "quotaBytes": quota,
        "reason": drain.reason,
        "schemaVersion": 1,
    }
    _until_done(_Published(log_dir_fd, log_name + ".truncated").publish, _canonical(fact))


def _run_shim(
    spec: dict[str, Any],
    log_fd: int,
    log_dir_fd: int,
    dir_fd: int,
    status_fd: int,
    ahead: _Ahead | None = None,
) -> NoReturn:
    """The long-lived shim (grandchild of the worker); ``ahead``: a spare's reservation."""
    _set_subreaper()
    _set_dumpable_off()
    # SIGXFSZ too: under a file-size limit (RLIMIT_FSIZE: ``ulimit -f``, systemd's LimitFSIZE)
    # a write past it then fails EFBIG, which the log's writing and the publishing handle as
    # any failed write, instead of ending the shim with no receipt. The interpreter ignores it
    # from start-up already (the early steps, a spare's reservation); named here so that it
    # stays so. The job gets every disposition back at its start (step 5).
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an inherited SIG_IGN would auto-reap the job
    receipt_file = _Published(dir_fd, spec["receipt_name"])
    try:
        claim = _claim() if ahead is None else ahead.claim
        try:  # the receipt's space, before any job exists; the claim names this shim
            if ahead is None or not receipt_file.adopt(ahead, spec.get("test_hook")):
                receipt_file.reserve(RECEIPT_RESERVE_BYTES, _canonical(claim))
        except OSError as exc:
            raise ShimError("RECEIPT_RESERVE_FAILED", exc.errno) from None
        read_fd, write_fd = os.pipe()  # both close-on-exec; the job gets dup2 copies
        started_at_ms = _now_ms()
        cgroup = _make_cgroup(spec)
        # The process limit: the job cgroup's pids.max where it can hold it, else RLIMIT_NPROC
        # for a job user (app/worker/process_limit.py).
        pids_held = cgroup is not None and _limit_pids(cgroup, spec.get("max_processes"))
        home = _job_home(spec)
        moved = False  # the shim went into the job's cgroup (the fallback) and must leave
        try:
            job_pid = (
                None
                if cgroup is None
                else _spawn_into(spec, write_fd, home, cgroup, _nproc(spec, pids_held))
            )
            if job_pid is None:
                if cgroup is not None and not _enter_cgroup(cgroup):
                    cgroup, pids_held = None, False
                moved = cgroup is not None
                job_pid = _spawn(spec, write_fd, home, _nproc(spec, pids_held))
        except ShimError:
            if cgroup is not None and (not moved or _leave_cgroup(spec)):
                _remove_cgroup(cgroup)
            if home is not None:
                _remove_home(spec["job"], home)
            raise
        shim_inside = moved and not _leave_cgroup(spec)
        os.close(write_fd)
        pgid, start_ticks = _proc_stat(job_pid)
        status_line = {
            "ok": True,
            **claim,
            "pid": job_pid,
            "pgid": pgid,
            "start_ticks": start_ticks,
            "started_at_ms": started_at_ms,
            "cgroup": None if cgroup is None else cgroup.rsplit("/", 1)[1],
        }
    except ShimError as exc:
        receipt_file.discard()
        _fail(status_fd, exc.code, exc.errno)
    _status(status_fd, status_line)

    drain = _Drain(log_fd, spec["log_quota_bytes"])
    stopped: list[int] = []

    def stop_leftovers() -> None:
        stopped.append(_stop_leftovers(cgroup, shim_inside))

    kill = spec["leftovers"] == "kill"
    wait_status = _supervise(job_pid, read_fd, drain, stop_leftovers if kill else None)
    finished_at_ms = max(_now_ms(), started_at_ms)
    drain.finish()  # the output's last bytes after the head; a write error only drops them
    try:  # noqa: SIM105
        os.fsync(log_fd)
    except OSError:
        pass  # the log is evidence only; the receipt is still published
    os.close(log_fd)
    hook = spec.get("test_hook")
    if drain.dropped:
        log_name = os.path.basename(spec["log_path"])
        _publish_truncation(log_dir_fd, log_name, drain, spec["log_quota_bytes"])
    receipt: dict[str, Any] = {
        "schemaVersion": 1,
        "runId": spec["run_id"],
        "attemptId": spec["attempt_id"],
        "callbackSequence": spec["callback_sequence"],
        "token": spec["token"],
        "startedAtMs": started_at_ms,
        "finishedAtMs": finished_at_ms,
    }
    if stopped:
        receipt["leftoversStopped"] = stopped[0]
    if os.WIFSIGNALED(wait_status):
        receipt["signal"] = os.WTERMSIG(wait_status)
        receipt["exitCode"] = 128 + receipt["signal"]
    else:
        receipt["exitCode"] = os.WEXITSTATUS(wait_status)
    if hook == "exit_before_receipt":
        os._exit(HOOK_EXIT_CODE)
    # Until it is published the run stays running (the shim lives), never lost.
    _until_done(receipt_file.publish, _canonical(receipt), hook)
    if home is not None:
        _remove_home(spec["job"], home, hook)  # after the receipt; waited for 1 s at most
    os._exit(0)


def _mark_cloexec() -> None:
    """Whatever leaked into us beyond 0, 1, 2 must never reach the job."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:  # noqa: SIM105
                os.set_inheritable(fd, False)
            except OSError:
                pass


def _prepare(raw: bytes, status_fd: int) -> tuple[dict[str, Any], int, int, int]:
    """§3 steps 1 and 2 after the fds are marked: the validated spec, the log, its directory and
    the receipt directory, opened; a failure is reported on ``status_fd`` and ends us."""
    try:
        spec = _parse_spec(raw)
    except ShimError as exc:
        _fail(status_fd, exc.code, exc.errno)
    log_flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        log_fd = os.open(spec["log_path"], log_flags)
    except OSError as exc:
        _fail(status_fd, "LOG_OPEN_FAILED", exc.errno)
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:  # the truncation fact is published in the log's directory
        log_dir_fd = os.open(os.path.dirname(spec["log_path"]), dir_flags)
    except OSError as exc:
        _fail(status_fd, "LOG_OPEN_FAILED", exc.errno)
    try:
        dir_fd = os.open(spec["receipt_dir"], dir_flags)
    except OSError as exc:
        _fail(status_fd, "SPEC_INVALID", exc.errno)
    return spec, log_fd, log_dir_fd, dir_fd


def run(raw: bytes, status_fd: int) -> NoReturn:
    """One launch from the spec bytes: the one-shot ``main`` and a zygote child without a
    spare end here (a spare runs the same steps, its session and fork made beforehand).

    Everything after the spec is read is the same in both modes: validate, open the log and
    the receipt directory, own session, fork, the long-lived shim reports on ``status_fd``.
    """
    _mark_cloexec()
    spec, log_fd, log_dir_fd, dir_fd = _prepare(raw, status_fd)
    if os.getsid(0) != os.getpid():
        os.setsid()
    if os.fork() != 0:
        os._exit(0)  # our parent (worker or zygote) reaps this process; the shim is re-parented
    _run_shim(spec, log_fd, log_dir_fd, dir_fd, status_fd)


def main() -> NoReturn:
    """One-shot mode: spec on stdin, status line on stdout."""
    try:
        raw = _read_stdin()
    except ShimError as exc:
        _fail(1, exc.code, exc.errno)
    except OSError:
        _fail(1, "SPEC_INVALID")
    run(raw, 1)


# ---- zygote (fork server) mode --------------------------------------------------------
# ``shim.py --zygote [RECEIPTS_ROOT]``: started once by the worker with an AF_UNIX stream
# socket on fd 0 and /dev/null on 1 and 2 (api-schemas/launch-protocol.md §8); with the
# receipts root, each spare makes its receipt reservation there ahead. Per launch the
# worker sends ``b"L" + u32 length + spec`` with the write end of a fresh status pipe attached
# (SCM_RIGHTS); the zygote hands both to its spare (a shim forked ahead, waiting in its own
# session), or forks a child that runs ``run(spec, status_fd)`` exactly as the one-shot shim
# does when no spare takes them, and answers ``b"P" + u32 pid`` with the first shim process
# (``b"F" + u32 errno`` if the fork failed). That process stays unreaped (pinning its pid,
# which is its session id) until the worker sends ``b"R" + u32 pid``. EOF on the socket ends
# the zygote, and so a waiting spare; running shims are untouched.

ZYGOTE_READY = b"Z1"


def _recv_exact(sock: Any, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _recv_body(sock: Any, length: int) -> bytes:
    """The body; beyond SPEC_MAX_BYTES only one extra byte is kept (the child says invalid)."""
    chunks: list[bytes] = []
    kept = 0
    left = length
    while left:
        chunk = sock.recv(min(left, READ_CHUNK))
        if not chunk:
            raise EOFError
        left -= len(chunk)
        if kept <= SPEC_MAX_BYTES:
            chunks.append(chunk[: SPEC_MAX_BYTES + 1 - kept])
            kept += len(chunks[-1])
    return b"".join(chunks)


def _recv_request(sock: Any, rights: int, space: int, flags: int) -> tuple[bytes, int, list[int]]:
    """(kind, u32, fds) of the next message; fds arrive close-on-exec."""
    data, ancdata, _flags, _addr = sock.recvmsg(5, space, flags)
    fds: list[int] = []
    for _level, kind, payload in ancdata:
        if kind == rights:
            usable = len(payload) - len(payload) % 4
            fds.extend(
                int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, usable, 4)
            )
    if not data:
        raise EOFError
    if len(data) < 5:
        data += _recv_exact(sock, 5 - len(data))
    return data[:1], int.from_bytes(data[1:5], "big"), fds


def _to_devnull(sock: Any) -> None:
    """In a zygote child: fd 0 (the zygote's socket) becomes /dev/null; 1 and 2 already are."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # replaces (closes) the zygote's socket
    if null > 2:
        os.close(null)
    sock.detach()


def _zygote_child(sock: Any, raw: bytes, status_fd: int) -> NoReturn:
    try:
        _to_devnull(sock)
        # SIGINT/SIGHUP stay ignored until the long-lived shim ignores them itself; the
        # job gets every disposition reset by posix_spawn (step 5).
        run(raw, status_fd)
    finally:
        os._exit(1)  # never return into the zygote's loop


def _fork_child(sock: Any, raw: bytes, status_fd: int) -> bytes:
    """Fork the first shim process for one request; the reply to send to the worker."""
    try:
        pid = os.fork()
    except OSError as exc:
        return b"F" + (exc.errno or 0).to_bytes(4, "big")
    if pid == 0:
        _zygote_child(sock, raw, status_fd)
    return b"P" + pid.to_bytes(4, "big")


class _Spare:
    """A shim forked before its launch (§8 "Spare"): the first process ``pid`` made its own
    session and forked the long-lived shim, which waits on ``sock`` for a spec."""

    def __init__(self, pid: int, sock: Any) -> None:
        self.pid: int = pid
        self.sock = sock


def _spare_child(
    ctl: Any, ours: Any, theirs: Any, rights: int, space: int, flags: int, root: str | None
) -> NoReturn:
    """The first process of a spare, then (after its fork) the waiting long-lived shim, with
    its receipt reservation made ahead in ``root`` (the receipts root) when it can be."""
    try:
        _to_devnull(ctl)
        ours.close()
        os.setsid()
        if os.fork() != 0:
            os._exit(0)  # pinned unreaped by the zygote until the worker releases it
        _mark_cloexec()
        ahead = _reserve_ahead(root)
        if ahead is not None:
            _UNUSED.append(ahead)  # dropped by _fail and every exit below unless taken
        try:
            kind, length, fds = _recv_request(theirs, rights, space, flags)
            if kind != b"L" or len(fds) != 1:
                _exit_unused(0)  # the zygote went away (or discarded us): no launch is ours
            raw = _recv_body(theirs, length)
        except (EOFError, OSError):
            _exit_unused(0)
        theirs.close()
        spec, log_fd, log_dir_fd, dir_fd = _prepare(raw, fds[0])
        _run_shim(spec, log_fd, log_dir_fd, dir_fd, fds[0], ahead)
    finally:
        _exit_unused(1)


_UNUSED: list[_Ahead] = []  # a spare's reservation made ahead, until a launch takes it


def _exit_unused(code: int) -> NoReturn:
    """Exit, removing a reservation made ahead that no launch took."""
    for ahead in _UNUSED:
        ahead.drop()
    os._exit(code)


def _new_spare(
    ctl: Any, family: int, kind: int, rights: int, space: int, flags: int, root: str | None
) -> _Spare | None:
    """Fork a spare; None when that fails now (the next launch forks its shim itself)."""
    import _socket

    try:
        ours, theirs = _socket.socketpair(family, kind)
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return None
    if pid == 0:
        _spare_child(ctl, ours, theirs, rights, space, flags, root)
    theirs.close()
    return _Spare(pid, ours)


def _hand_over(spare: _Spare, raw: bytes, status_fd: int, rights: int, level: int) -> bytes | None:
    """Send the spec and status fd to the spare; the reply for the worker, or None when the
    spare is gone (then no complete spec reached it, and nothing of this launch started)."""
    import array  # a built-in module, imported by ``serve`` before the first launch

    message = b"L" + len(raw).to_bytes(4, "big") + raw
    try:
        sent = spare.sock.sendmsg([message], [(level, rights, array.array("i", [status_fd]))])
        if sent < len(message):
            spare.sock.sendall(message[sent:])
    except OSError:
        return None
    return b"P" + spare.pid.to_bytes(4, "big")


def serve(args: list[str] | None = None) -> int:
    """The zygote loop: one request at a time, single-threaded, until EOF on fd 0.

    ``args``: empty, or the receipts root (an absolute path) where each spare makes its
    receipt reservation ahead (§8 "Reservation made ahead")."""
    root = args[0] if args and len(args) == 1 and os.path.isabs(args[0]) else None
    import _socket  # the C module: ``socket`` would pull in enum, selectors, ...
    import array  # noqa: F401 - for ``_hand_over``, before the first launch

    sock = _socket.socket(fileno=0)
    rights, level = _socket.SCM_RIGHTS, _socket.SOL_SOCKET
    space = _socket.CMSG_SPACE(4 * 4)
    flags = _socket.MSG_CMSG_CLOEXEC
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are for the worker
        signal.signal(sig, signal.SIG_IGN)
    _mark_cloexec()
    _prctl(), _capset(), _clone3(), _setrlimit(), _boot_id()  # once, not in every forked shim

    def spare_now() -> _Spare | None:
        return _new_spare(sock, _socket.AF_UNIX, _socket.SOCK_STREAM, rights, space, flags, root)

    spare = spare_now()
    released: set[int] = set()
    poller = select.poll()
    poller.register(0, select.POLLIN)
    sock.sendall(ZYGOTE_READY)
    while True:
        # Poll with a short timeout only while a released child may still be exiting.
        if poller.poll(50 if released else None):
            try:
                kind, value, fds = _recv_request(sock, rights, space, flags)
            except (EOFError, OSError):
                return 0
            if kind == b"R" and not fds:
                released.add(value)
            elif kind == b"L" and len(fds) == 1:
                try:
                    raw = _recv_body(sock, value)
                    reply = None
                    if spare is not None:
                        reply = _hand_over(spare, raw, fds[0], rights, level)
                        if reply is None:
                            # Gone, or refused the message (ENOBUFS...): reap its first
                            # process; a live spare ends on the EOF of the close below.
                            released.add(spare.pid)
                        spare.sock.close()
                        spare = None
                    if reply is None:
                        reply = _fork_child(sock, raw, fds[0])
                    sock.sendall(reply)
                except (EOFError, OSError):
                    return 0
                finally:
                    os.close(fds[0])
                spare = spare_now()  # after the reply: off the launch's path
            else:
                for fd in fds:
                    os.close(fd)
                return 2  # protocol violation: the worker restarts us
        for pid in list(released):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0] != 0
            except ChildProcessError:
                done = True
            if done:
                released.discard(pid)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[2:]) if sys.argv[1:2] == ["--zygote"] else main())
