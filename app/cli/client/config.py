"""Where the client commands find the server and the token (docs/cli.md §2).

Precedence: ``--url`` / ``--token``, then ``QL_URL`` / ``QL_TOKEN``, then the config file
(``$QL_CLIENT_CONFIG``, else ``$XDG_CONFIG_HOME/qinglong/client.toml``, else
``~/.config/qinglong/client.toml``), then ``http://127.0.0.1:8000`` for the url. The file
holds a token, so it is read only when it is a regular file owned by the user with no
permission for group or others (0600 or 0400), opened without following a symlink and
checked on the open descriptor; anything else is refused with one line naming the fix.
``qinglong login`` writes it that way (a fresh 0600 file renamed into place).
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path

from app.cli.client.api import EXIT_USAGE, ClientError

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Target:
    """The server url and the token a command uses."""

    url: str
    token: str
    # Where the token came from, for a 401's line: "--token", "QL_TOKEN" or the file's path.
    token_from: str = "--token"


class ConfigRefused(ClientError):
    """The config file exists but may not be read, or does not parse."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


def config_path(env: dict[str, str] | None = None) -> Path:
    """The config file's path for this environment."""
    env = dict(os.environ) if env is None else env
    if env.get("QL_CLIENT_CONFIG"):
        return Path(env["QL_CLIENT_CONFIG"])
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "qinglong" / "client.toml"


def read_config(path: Path) -> dict[str, str]:
    """``{"url", "token"}`` (those present) from ``path``; {} when there is no file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        if os.path.islink(path):
            raise ConfigRefused(
                f"config file {path} is a symlink; refusing to read it (point "
                "QL_CLIENT_CONFIG at the file itself)"
            ) from None
        raise ConfigRefused(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigRefused(f"config file {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise ConfigRefused(
                f"config file {path} is owned by uid {st.st_uid}, not by you "
                f"(uid {os.geteuid()}); refusing to read a token from it"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise ConfigRefused(
                f"config file {path} has mode {mode:04o}, readable by others; "
                f"run `chmod 600 {path}`"
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(1 << 16)
    finally:
        os.close(fd)
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigRefused(f"config file {path} is not valid TOML: {exc}") from None
    out: dict[str, str] = {}
    for key in ("url", "token"):
        value = doc.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigRefused(f"config file {path}: {key} must be a string")
        if value:
            out[key] = value
    return out


def resolve(url: str | None, token: str | None, env: dict[str, str] | None = None) -> Target:
    """The Target from flags, then the environment, then the config file."""
    env = dict(os.environ) if env is None else env
    url = url or env.get("QL_URL") or None
    token_from = "--token" if token else "QL_TOKEN"
    token = token or env.get("QL_TOKEN") or None
    if url is None or token is None:
        path = config_path(env)
        stored = read_config(path)
        url = url or stored.get("url")
        if token is None:
            token, token_from = stored.get("token"), f"the config file {path}"
    return Target(url=url or DEFAULT_URL, token=check_token(token), token_from=token_from)


def check_token(token: str | None) -> str:
    """``token`` stripped, if it can be sent in a header; else a ClientError (never echoing it)."""
    token = (token or "").strip()
    if not token:
        raise ClientError(
            "no API token: pass --token, set QL_TOKEN or run `qinglong login` (a new "
            "service's first token: `qinglong token bootstrap` on its machine)",
            EXIT_USAGE,
        )
    if not all("\x21" <= ch <= "\x7e" for ch in token):
        raise ClientError(
            "the API token holds spaces, control or non-ASCII characters (a token is ql_ "
            "and 43 more characters); check --token, QL_TOKEN or the config file",
            EXIT_USAGE,
        )
    return token


def write_config(path: Path, *, url: str, token: str) -> None:
    """Write ``url`` and ``token`` to ``path`` as a fresh 0600 file, atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    text = (
        f"# written by `qinglong login`; keep it 0600\nurl = {_toml(url)}\ntoken = {_toml(token)}\n"
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _toml(value: str) -> str:
    # A JSON string with every non-ASCII character escaped is a valid TOML basic string.
    return json.dumps(value, ensure_ascii=True)
