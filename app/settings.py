"""Settings from the environment (``QL_`` prefix) or flags, with the profile as typed values."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.domain.profiles import Profile, profile_named

DEFAULT_DATA_DIR = "./.qinglong"
SHIM_MODES = ("zygote", "exec")
LEASE_TTL_S = 30.0
LEASE_RENEW_S = 10.0


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

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, data_dir: str | None = None
    ) -> Settings:
        """Read ``QL_*`` variables; ``data_dir`` (a flag) wins over ``QL_DATA_DIR``."""
        env = os.environ if env is None else env
        root = Path(data_dir or env.get("QL_DATA_DIR") or DEFAULT_DATA_DIR).absolute()
        url = env.get("QL_DATABASE_URL") or f"sqlite:///{root / 'qinglong.db'}"
        origins = tuple(o.strip() for o in env.get("QL_CORS_ORIGINS", "").split(",") if o.strip())
        socket = env.get("QL_WORKER_SOCKET")
        ttl, renew = lease_timing_from_env(env)
        return cls(
            data_dir=root,
            database_url=url,
            profile=profile_named(env.get("QL_PROFILE") or "standalone"),
            cors_origins=origins,
            secret_key=env.get("QL_SECRET_KEY") or None,
            worker_socket=Path(socket).absolute() if socket else None,
            shim_mode=shim_mode_from_env(env),
            lease_ttl_s=ttl,
            lease_renew_s=renew,
            cgroup_root=env.get("QL_CGROUP_ROOT") or "auto",
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

    def with_data_dir(self, data_dir: Path) -> Settings:
        """A copy rooted elsewhere (the database URL follows only if it was the default)."""
        url = self.database_url
        if url == f"sqlite:///{self.data_dir / 'qinglong.db'}":
            url = f"sqlite:///{data_dir / 'qinglong.db'}"
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
