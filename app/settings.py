"""Settings from the environment (``QL_`` prefix) or flags, with the profile as typed values."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.domain.profiles import Profile, profile_named
from app.domain.retention import MAX_BYTES, MAX_KEEP_DAYS, MAX_KEEP_RUNS, RetentionPolicy

DEFAULT_DATA_DIR = "./.qinglong"
SHIM_MODES = ("zygote", "exec")
LEASE_TTL_S = 30.0
LEASE_RENEW_S = 10.0
# A job user's files are private to it unless the operator says otherwise (docs/job-user.md).
DEFAULT_JOB_UMASK = 0o077
# Per-job HOMEs go where every user may create a directory (sticky, world-writable); each
# name carries 48 random bits and is created with mkdir by the job user (docs/job-user.md).
JOB_HOME_ROOT = Path("/tmp")  # noqa: S108
# QL_JOB_MAX_PROCESSES's default: processes (and threads) a job may have at once, by its
# cgroup's pids.max, else per job user by RLIMIT_NPROC (docs/job-user.md, "Process limit").
DEFAULT_JOB_MAX_PROCESSES = 4096
# At least the job and one child (the shim's fallback way into the cgroup counts itself too).
JOB_MAX_PROCESSES_LEAST = 2
# pid_max's ceiling on 64-bit Linux: more is no limit at all.
JOB_MAX_PROCESSES_MOST = 4_194_304
HTTP_PARSERS = ("httptools", "h11")
# Set by ``qinglong serve`` for each start of a role: 1, 2, ... in the supervisor's lifetime.
# A restarted worker leaves out what its first start already said of the settings (they have
# not changed): a database outage restarts it every few seconds (docs/operations.md §5).
SERVICE_START_ENV = "QL_SERVICE_START"


def shim_mode_from_env(env: Mapping[str, str]) -> str:
    """``QL_SHIM_MODE``: ``zygote`` (default, fork server) or ``exec`` (fresh interpreter)."""
    mode = env.get("QL_SHIM_MODE") or SHIM_MODES[0]
    if mode not in SHIM_MODES:
        raise ValueError(f"QL_SHIM_MODE must be one of {', '.join(SHIM_MODES)}, not {mode!r}")
    return mode


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, not {raw!r}") from None
    if not 0 < value < 86_400:
        raise ValueError(f"{name} must be more than 0 and less than a day, not {raw}")
    return value


def lease_timing_from_env(env: Mapping[str, str]) -> tuple[float, float]:
    """``QL_WORKER_LEASE_TTL_S`` and ``QL_WORKER_LEASE_RENEW_S`` (renewals must fit a TTL)."""
    ttl = _seconds(env, "QL_WORKER_LEASE_TTL_S", LEASE_TTL_S)
    renew = _seconds(env, "QL_WORKER_LEASE_RENEW_S", min(LEASE_RENEW_S, ttl / 3))
    if renew * 2 > ttl:
        # One late renewal must not lose the lease: at least two fit in one TTL.
        raise ValueError("QL_WORKER_LEASE_RENEW_S must be at most half of QL_WORKER_LEASE_TTL_S")
    return ttl, renew


def advertise_url_from_env(env: Mapping[str, str]) -> str | None:
    """``QL_ADVERTISE_URL``: an ``http://`` or ``https://`` base URL without a path, or None."""
    raw = (env.get("QL_ADVERTISE_URL") or "").strip().rstrip("/")
    if not raw:
        return None
    scheme, sep, rest = raw.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or "/" in rest or len(raw) > 255:
        raise ValueError(
            f"QL_ADVERTISE_URL must be an http:// or https:// base URL without a path, not {raw!r}"
        )
    return raw


def job_umask_from_env(env: Mapping[str, str]) -> int:
    """``QL_JOB_UMASK``: an octal umask for jobs run as the job user (default 077)."""
    raw = env.get("QL_JOB_UMASK")
    if not raw:
        return DEFAULT_JOB_UMASK
    try:
        value = int(raw, 8)
    except ValueError:
        raise ValueError(f"QL_JOB_UMASK must be an octal umask such as 077, not {raw!r}") from None
    if not 0 <= value <= 0o777:
        raise ValueError(f"QL_JOB_UMASK must be between 000 and 777, not {raw}")
    return value


def job_max_processes_from_env(env: Mapping[str, str]) -> int | None:
    """``QL_JOB_MAX_PROCESSES``: a whole number, or ``off`` (None: no limit)."""
    raw = (env.get("QL_JOB_MAX_PROCESSES") or "").strip()
    if not raw:
        return DEFAULT_JOB_MAX_PROCESSES
    if raw.lower() == "off":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"QL_JOB_MAX_PROCESSES must be a whole number or off, not {raw!r}"
        ) from None
    if not JOB_MAX_PROCESSES_LEAST <= value <= JOB_MAX_PROCESSES_MOST:
        raise ValueError(
            f"QL_JOB_MAX_PROCESSES must be between {JOB_MAX_PROCESSES_LEAST} and "
            f"{JOB_MAX_PROCESSES_MOST}, or off, not {raw}"
        )
    return value


def _names(raw: str | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in (raw or "").split(",") if n.strip()))


def _abs_path_or_none(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name)
    if not raw:
        return None
    if not raw.startswith("/"):
        raise ValueError(f"{name} must be an absolute path, not {raw!r}")
    return Path(raw)


@dataclass(frozen=True)
class JobUserSettings:
    """Who jobs run as (docs/job-user.md): the service's own user when ``user`` is None."""

    # QL_JOB_USER: a user name or uid; the group is that user's primary group.
    user: str | None = None
    # QL_JOB_USERS: the users a revision's ``run_as`` may name (the api refuses others).
    allowed: tuple[str, ...] = ()
    umask: int = DEFAULT_JOB_UMASK
    # QL_JOB_HOME: one HOME for every job; None means a fresh per-job HOME under home_root.
    home: Path | None = None
    home_root: Path = JOB_HOME_ROOT

    @property
    def configured(self) -> bool:
        """True when any job may run as another user (the worker must be able to switch)."""
        return self.user is not None or bool(self.allowed)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobUserSettings:
        """Read ``QL_JOB_USER``, ``QL_JOB_USERS``, ``QL_JOB_UMASK``, ``QL_JOB_HOME``(``_ROOT``)."""
        return cls(
            user=(env.get("QL_JOB_USER") or "").strip() or None,
            allowed=_names(env.get("QL_JOB_USERS")),
            umask=job_umask_from_env(env),
            home=_abs_path_or_none(env, "QL_JOB_HOME"),
            home_root=_abs_path_or_none(env, "QL_JOB_HOME_ROOT") or JOB_HOME_ROOT,
        )


def _count(env: Mapping[str, str], name: str, default: int, least: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {raw!r}") from None
    if value < least:
        raise ValueError(f"{name} must be at least {least}, not {raw}")
    return value


@dataclass(frozen=True)
class HttpLimits:
    """What one api process accepts before a request reaches the app (docs/http-limits.md)."""

    # Request line plus headers; more is answered 431 and the connection closed.
    max_header_bytes: int = 64 * 1024
    # From a connection's open (or a keep-alive request's first byte) to its complete headers.
    header_timeout_s: float = 10.0
    # The longest pause in a request body that is still owed.
    body_timeout_s: float = 30.0
    # Open connections per api process (each uvicorn worker); see docs/http-limits.md.
    max_connections: int = 1000
    # uvicorn's parser: httptools (what uvicorn picks itself when installed) or pure-Python h11.
    parser: str = HTTP_PARSERS[0]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HttpLimits:
        """The ``QL_HTTP_*`` variables (README's settings table, docs/http-limits.md)."""
        default = cls()
        parser = env.get("QL_HTTP_PARSER") or default.parser
        if parser not in HTTP_PARSERS:
            raise ValueError(
                f"QL_HTTP_PARSER must be one of {', '.join(HTTP_PARSERS)}, not {parser!r}"
            )
        return cls(
            # Below 1 KiB an ordinary browser request (cookies, user agent) no longer fits.
            max_header_bytes=_count(
                env, "QL_HTTP_MAX_HEADER_BYTES", default.max_header_bytes, 1024
            ),
            header_timeout_s=_seconds(env, "QL_HTTP_HEADER_TIMEOUT_S", default.header_timeout_s),
            body_timeout_s=_seconds(env, "QL_HTTP_BODY_TIMEOUT_S", default.body_timeout_s),
            max_connections=_count(env, "QL_HTTP_MAX_CONNECTIONS", default.max_connections, 1),
            parser=parser,
        )


# QL_MAX_QUEUED's default: queued runs beyond it are refused (docs/concurrency-budgets.md §3).
MAX_QUEUED = 10_000
# Upper bounds a typo would otherwise turn into "no budget at all".
MAX_RUNNING_LIMIT = 10_000
MAX_QUEUED_LIMIT = 10_000_000


def _bounded_count(env: Mapping[str, str], name: str, default: int, most: int) -> int:
    value = _count(env, name, default, 1)
    if value > most:
        raise ValueError(f"{name} must be at most {most}, not {value}")
    return value


@dataclass(frozen=True)
class RetentionSettings:
    """The global retention policy (docs/retention.md §1): the profile's, or QL_RETENTION_*.

    ``None`` fields mean the profile's value; ``enabled`` False (QL_RETENTION=off) runs no
    sweep at all (nothing is ever deleted, as before retention existed).
    """

    enabled: bool = True
    keep_runs: int | None = None
    keep_days: int | None = None
    keep_rows: int | None = None
    task_log_bytes: int | None = None
    total_log_bytes: int | None = None
    interval_s: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RetentionSettings:
        """``QL_RETENTION`` (on|off) and ``QL_RETENTION_{KEEP_RUNS,KEEP_DAYS,KEEP_ROWS,
        TASK_LOG_BYTES,TOTAL_LOG_BYTES,INTERVAL_S}``."""
        switch = (env.get("QL_RETENTION") or "on").strip().lower()
        if switch not in ("on", "off"):
            raise ValueError(f"QL_RETENTION must be on or off, not {switch!r}")

        def opt(name: str, least: int, most: int) -> int | None:
            if not env.get(name):
                return None
            value = _count(env, name, 0, least)
            if value > most:
                raise ValueError(f"{name} must be at most {most}, not {value}")
            return value

        interval = None
        if env.get("QL_RETENTION_INTERVAL_S"):
            interval = _seconds(env, "QL_RETENTION_INTERVAL_S", 30.0)
        return cls(
            enabled=switch == "on",
            keep_runs=opt("QL_RETENTION_KEEP_RUNS", 0, MAX_KEEP_RUNS),
            keep_days=opt("QL_RETENTION_KEEP_DAYS", 0, MAX_KEEP_DAYS),
            keep_rows=opt("QL_RETENTION_KEEP_ROWS", 1, MAX_KEEP_RUNS * 10),
            task_log_bytes=opt("QL_RETENTION_TASK_LOG_BYTES", 0, MAX_BYTES),
            total_log_bytes=opt("QL_RETENTION_TOTAL_LOG_BYTES", 0, MAX_BYTES),
            interval_s=interval,
        )

    def policy(self, profile: Profile) -> RetentionPolicy:
        """The global per-task policy: these values over the profile's defaults."""
        d = profile.retention
        keep_runs = d.keep_runs if self.keep_runs is None else self.keep_runs
        keep_rows = d.keep_rows if self.keep_rows is None else self.keep_rows
        if self.keep_rows is None and keep_rows <= keep_runs:
            keep_rows = keep_runs * 2 + 1
        try:
            return RetentionPolicy(
                keep_runs=keep_runs,
                keep_days=d.keep_days if self.keep_days is None else self.keep_days,
                keep_rows=keep_rows,
                task_log_bytes=d.task_log_bytes
                if self.task_log_bytes is None
                else self.task_log_bytes,
            ).validated()
        except Exception as exc:  # ValidationFailed: a setting, so a ValueError at start
            raise ValueError(f"QL_RETENTION_*: {getattr(exc, 'detail', exc)}") from None

    def total_log_bytes_of(self, profile: Profile) -> int:
        """The budget of every task's log bytes together."""
        return (
            profile.retention.total_log_bytes
            if self.total_log_bytes is None
            else (self.total_log_bytes)
        )

    def interval_of(self, profile: Profile) -> float:
        """The sweep's cadence in seconds."""
        return profile.retention.interval_s if self.interval_s is None else self.interval_s


def default_database_url(data_dir: Path) -> str:
    """The SQLite database in ``data_dir``: the default when QL_DATABASE_URL is unset."""
    return f"sqlite:///{data_dir / 'qinglong.db'}"


# The URLs the engine can open (app/storage/engine.py): SQLite, or PostgreSQL through psycopg 3
# (SQLAlchemy's driver for a bare ``postgresql://``). Another scheme was a traceback at the
# first connect (its driver is not installed), from every command.
DATABASE_SCHEMES = ("sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg")
DATABASE_URL_FORM = "sqlite:///PATH or postgresql+psycopg://USER@HOST[:PORT]/DATABASE"


def database_url_from_env(env: Mapping[str, str], data_dir: Path) -> str:
    """``QL_DATABASE_URL``, or the SQLite file in ``data_dir`` when unset. A URL the engine
    cannot open is refused in one line that names what is wrong, never the URL itself: it
    may hold a password."""
    raw = env.get("QL_DATABASE_URL")
    if not raw:
        return default_database_url(data_dir)
    scheme, sep, _ = raw.partition("://")
    why = None
    if not sep:
        why = "no scheme"
    elif scheme not in DATABASE_SCHEMES:
        shown = scheme if scheme.replace("+", "").replace("-", "").isalnum() else "?"
        why = f"the scheme {shown[:40]}"
    elif scheme.startswith("postgresql") and not _ports_are_numbers(raw):
        why = "the port is not a number"
    if why is not None:
        raise ValueError(f"QL_DATABASE_URL must be {DATABASE_URL_FORM} ({why})")
    return raw


def _ports_are_numbers(raw: str) -> bool:
    """Whether the URL's port, if any, is a number, by SQLAlchemy's own parser: a password
    may hold ``/``, ``?`` or ``:``, which a split by hand read as part of the host."""
    from sqlalchemy.engine import make_url  # only for a PostgreSQL URL

    try:
        make_url(raw)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Settings:
    """Everything a process of the service needs to know about where it lives."""

    data_dir: Path
    database_url: str
    profile: Profile
    cors_origins: tuple[str, ...] = ()
    secret_key: str | None = field(default=None, repr=False)
    worker_socket: Path | None = None
    shim_mode: str = SHIM_MODES[0]
    lease_ttl_s: float = LEASE_TTL_S
    lease_renew_s: float = LEASE_RENEW_S
    # QL_CGROUP_ROOT: "auto" (the worker's own cgroup v2), "off", or an absolute path
    # (app/worker/cgroups.py, docs/leftovers.md).
    cgroup_root: str = "auto"
    job: JobUserSettings = field(default_factory=JobUserSettings)
    # QL_JOB_MAX_PROCESSES (None: off); how it is enforced: app/worker/process_limit.py.
    job_max_processes: int | None = DEFAULT_JOB_MAX_PROCESSES
    http: HttpLimits = HttpLimits()
    # QL_MAX_RUNNING (None: the profile's max_running) and QL_MAX_QUEUED
    # (docs/concurrency-budgets.md).
    max_running_override: int | None = None
    max_queued: int = MAX_QUEUED
    # QL_ADVERTISE_URL: this host's api as other hosts reach it (docs/several-hosts.md); the
    # worker publishes it in its lease row. ``qinglong serve`` defaults it to its listen address.
    advertise_url: str | None = None
    retention: RetentionSettings = RetentionSettings()

    @property
    def max_running(self) -> int:
        """Runs dispatching or running at once: QL_MAX_RUNNING, else the profile's."""
        if self.max_running_override is not None:
            return self.max_running_override
        return self.profile.max_running

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, data_dir: str | None = None
    ) -> Settings:
        """Read ``QL_*`` variables; ``data_dir`` (a flag) wins over ``QL_DATA_DIR``."""
        env = os.environ if env is None else env
        root = Path(data_dir or env.get("QL_DATA_DIR") or DEFAULT_DATA_DIR).absolute()
        url = database_url_from_env(env, root)
        origins = tuple(o.strip() for o in env.get("QL_CORS_ORIGINS", "").split(",") if o.strip())
        socket = env.get("QL_WORKER_SOCKET")
        ttl, renew = lease_timing_from_env(env)
        max_running = None
        if env.get("QL_MAX_RUNNING"):
            max_running = _bounded_count(env, "QL_MAX_RUNNING", 1, MAX_RUNNING_LIMIT)
        profile = profile_named(env.get("QL_PROFILE") or "standalone")
        retention = RetentionSettings.from_env(env)
        retention.policy(profile)  # a contradiction (keep_rows <= keep_runs) fails at start
        return cls(
            data_dir=root,
            database_url=url,
            profile=profile,
            cors_origins=origins,
            secret_key=env.get("QL_SECRET_KEY") or None,
            worker_socket=Path(socket).absolute() if socket else None,
            shim_mode=shim_mode_from_env(env),
            lease_ttl_s=ttl,
            lease_renew_s=renew,
            cgroup_root=env.get("QL_CGROUP_ROOT") or "auto",
            job=JobUserSettings.from_env(env),
            job_max_processes=job_max_processes_from_env(env),
            http=HttpLimits.from_env(env),
            max_running_override=max_running,
            max_queued=_bounded_count(env, "QL_MAX_QUEUED", MAX_QUEUED, MAX_QUEUED_LIMIT),
            advertise_url=advertise_url_from_env(env),
            retention=retention,
        )

    def to_env(self) -> dict[str, str]:
        """The ``QL_*`` variables a flag may have set: with them, ``from_env`` in a child
        process resolves to these settings (every other setting is read from the inherited
        environment already).

        The one channel from a command to the processes it starts that re-read their settings:
        ``qinglong serve``'s services and ``qinglong api``'s uvicorn workers, which uvicorn
        spawns and builds with the app factory called without arguments.
        """
        env = {"QL_DATA_DIR": str(self.data_dir)}
        if self.worker_socket is not None:
            env["QL_WORKER_SOCKET"] = str(self.worker_socket)
        return env

    @property
    def database_in_data_dir(self) -> bool:
        """The database is the data dir's own SQLite file (no QL_DATABASE_URL elsewhere)."""
        return self.database_url == default_database_url(self.data_dir)

    def with_data_dir(self, data_dir: Path) -> Settings:
        """A copy rooted elsewhere (the database URL follows only if it was the default)."""
        url = self.database_url
        if self.database_in_data_dir:
            url = default_database_url(data_dir)
        return replace(self, data_dir=data_dir, database_url=url)

    @property
    def logs_dir(self) -> Path:
        """Root of the log artifacts (0700)."""
        return self.data_dir / "logs"

    @property
    def receipts_dir(self) -> Path:
        """Root of the completion receipts (0700, sharded by attempt-id prefix)."""
        return self.data_dir / "receipts"

    @property
    def socket_path(self) -> Path:
        """The worker's control socket."""
        return self.worker_socket or self.data_dir / "worker.sock"

    @property
    def key_file(self) -> Path:
        """The secret-encryption key file used when ``QL_SECRET_KEY`` is unset."""
        return self.data_dir / "secret.key"

    def ensure_data_dir(self) -> None:
        """Create the data dir as 0700 if it does not exist."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
