"""The validation rules of docs/api.md §1 as pure functions (each raises ValidationFailed)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from app.domain.errors import ErrorCode, ValidationFailed
from app.domain.execution import LEFTOVERS, Leftovers

MAX_ARGV_ITEMS = 64
MAX_ARG_BYTES = 4096
MAX_ENV_KEYS = 256
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_CWD_BYTES = 4096
TIMEOUT_MIN_S = 1
TIMEOUT_MAX_S = 604_800
PRIORITY_MIN = -100
PRIORITY_MAX = 100
MAX_CONCURRENT_MIN = 1
MAX_CONCURRENT_MAX = 1000
RESERVED_ENV_PREFIX = "QL3_"
SHELL_ALLOWLIST = frozenset({"/bin/sh", "/bin/bash"})
EXECUTORS = frozenset({"local_process"})

# Task, secret, schedule and token names; the API's documents state it as NAME_PATTERN.
NAME_RULE = r"[a-z0-9][a-z0-9._-]{0,127}"
NAME_PATTERN = f"^{NAME_RULE}$"
_NAME = re.compile(NAME_RULE)
_ENV_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")


def validate_name(name: str, *, what: str = "name") -> str:
    """Task and secret names: ``NAME_RULE``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValidationFailed(ErrorCode.INVALID_NAME, name_rule_broken(what))
    return name


def name_rule_broken(what: str) -> str:
    """The INVALID_NAME detail: the rule, never the name given."""
    return f"{what} must match {NAME_RULE}"


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _no_nul(text: str) -> bool:
    return "\x00" not in text


def validate_argv(argv: Sequence[str]) -> list[str]:
    """argv: 1..64 items, each <= 4096 bytes without NUL; argv[0] absolute or an allowed shell."""
    if not isinstance(argv, Sequence) or isinstance(argv, str) or not argv:
        raise ValidationFailed(ErrorCode.INVALID_ARGV, "argv must be a non-empty list of strings")
    if len(argv) > MAX_ARGV_ITEMS:
        raise ValidationFailed(
            ErrorCode.LIMIT_EXCEEDED, f"argv has more than {MAX_ARGV_ITEMS} items"
        )
    for index, item in enumerate(argv):
        if not isinstance(item, str):
            raise ValidationFailed(ErrorCode.INVALID_ARGV, f"argv[{index}] must be a string")
        if not _no_nul(item):
            raise ValidationFailed(ErrorCode.INVALID_ARGV, f"argv[{index}] contains NUL")
        if _utf8_len(item) > MAX_ARG_BYTES:
            raise ValidationFailed(
                ErrorCode.LIMIT_EXCEEDED, f"argv[{index}] is longer than {MAX_ARG_BYTES} bytes"
            )
    program = argv[0]
    if program in SHELL_ALLOWLIST:
        if len(argv) != 3 or argv[1] != "-c":
            raise ValidationFailed(
                ErrorCode.INVALID_ARGV,
                "a shell program must be called as [shell, '-c', script]; to run a script "
                "file, give its absolute path as argv[0] (executable, with its #! line), or "
                "[shell, '-c', 'sh ./script.sh'] with cwd",
            )
    elif not program.startswith("/") or "/../" in program + "/" or program.endswith("/"):
        raise ValidationFailed(
            ErrorCode.INVALID_ARGV,
            "argv[0] must be an absolute path to a program (such as /usr/bin/python3), or "
            "/bin/sh -c SCRIPT for a shell command line",
        )
    return list(argv)


def validate_cwd(cwd: str | None) -> str | None:
    """cwd: optional absolute path without NUL."""
    if cwd is None:
        return None
    if not isinstance(cwd, str) or not cwd.startswith("/") or not _no_nul(cwd):
        raise ValidationFailed(ErrorCode.INVALID_CWD, "cwd must be an absolute path")
    if _utf8_len(cwd) > MAX_CWD_BYTES:
        raise ValidationFailed(ErrorCode.LIMIT_EXCEEDED, "cwd is too long")
    return cwd


def validate_env_key(key: str) -> str:
    """Environment keys match ``[A-Z_][A-Z0-9_]*``; the ``QL3_`` prefix is reserved."""
    if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
        raise ValidationFailed(
            ErrorCode.INVALID_ENV_KEY, "environment keys must match [A-Z_][A-Z0-9_]*"
        )
    if len(key) > 256:
        raise ValidationFailed(ErrorCode.LIMIT_EXCEEDED, "environment key is too long")
    if key.startswith(RESERVED_ENV_PREFIX):
        raise ValidationFailed(
            ErrorCode.RESERVED_ENV_KEY, f"keys starting with {RESERVED_ENV_PREFIX} are reserved"
        )
    return key


def validate_env_value(value: str, *, key: str | None = None) -> str:
    """Environment values: at most 32 KiB, no NUL. ``key``, a valid key, names the value in
    the refusal (never the value itself)."""
    whose = "an environment value" if key is None else f"the value of {key}"
    if not isinstance(value, str) or not _no_nul(value):
        raise ValidationFailed(
            ErrorCode.INVALID_ENV_VALUE, f"{whose} must be a string without NUL"
        )
    if _utf8_len(value) > MAX_ENV_VALUE_BYTES:
        raise ValidationFailed(
            ErrorCode.LIMIT_EXCEEDED, f"{whose} is longer than {MAX_ENV_VALUE_BYTES} bytes"
        )
    return value


def validate_recipe(
    env: Mapping[str, str], secrets: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """A recipe: valid keys, no key in both maps, <= 256 keys in all, secret refs are names."""
    if len(env) + len(secrets) > MAX_ENV_KEYS:
        raise ValidationFailed(
            ErrorCode.LIMIT_EXCEEDED, f"a recipe holds at most {MAX_ENV_KEYS} keys"
        )
    for key, value in env.items():
        validate_env_key(key)
        validate_env_value(value, key=key)
    for key, ref in secrets.items():
        validate_env_key(key)
        validate_name(ref, what="secret reference")
    both = sorted(set(env) & set(secrets))
    if both:
        raise ValidationFailed(
            ErrorCode.DUPLICATE_ENV_KEY, f"key {both[0]} is both a value and a secret"
        )
    return dict(env), dict(secrets)


def validate_timeout(seconds: int | None) -> int | None:
    """timeout_seconds: optional, 1..604800."""
    if seconds is None:
        return None
    return _bounded_int(seconds, "timeout_seconds", TIMEOUT_MIN_S, TIMEOUT_MAX_S)


def validate_priority(priority: int) -> int:
    """priority: -100..100."""
    return _bounded_int(priority, "priority", PRIORITY_MIN, PRIORITY_MAX)


def _bounded_int(value: int, field: str, low: int, high: int) -> int:
    # bool is an int subclass: JSON true must not pass as 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationFailed(ErrorCode.VALIDATION_FAILED, f"{field} must be an integer")
    if not low <= value <= high:
        raise ValidationFailed(ErrorCode.LIMIT_EXCEEDED, f"{field} must be {low}..{high}")
    return value


def validate_executor(executor: str) -> str:
    """Only ``local_process`` is executable here."""
    if executor not in EXECUTORS:
        raise ValidationFailed(ErrorCode.VALIDATION_FAILED, "executor must be local_process")
    return executor


def validate_leftovers(leftovers: str) -> Leftovers:
    """leftovers: ``kill`` (default: the rest of the job dies with its main process) or
    ``keep``."""
    for value in LEFTOVERS:
        if leftovers == value:
            return value
    raise ValidationFailed(ErrorCode.VALIDATION_FAILED, "leftovers must be kill or keep")


def validate_max_concurrent(value: int | None) -> int | None:
    """max_concurrent: absent (unlimited) or 1..1000 runs of the task at once."""
    if value is None:
        return None
    return _bounded_int(value, "max_concurrent", MAX_CONCURRENT_MIN, MAX_CONCURRENT_MAX)


def validate_run_as(run_as: str | None, allowed: frozenset[str]) -> str | None:
    """run_as: absent, or one of the job users the operator allowed (QL_JOB_USERS)."""
    if run_as is None:
        return None
    if run_as not in allowed:
        raise ValidationFailed(
            ErrorCode.RUN_AS_NOT_ALLOWED, "run_as must name a user allowed by QL_JOB_USERS"
        )
    return run_as


def merge_environment(
    env: Mapping[str, str], secret_values: Mapping[str, str], reserved: Mapping[str, str]
) -> dict[str, str]:
    """Freeze a job's environment: recipe values, resolved secrets, then our ``QL3_*`` ids."""
    merged: dict[str, str] = {}
    merged.update(env)
    merged.update(secret_values)
    for key in reserved:
        if not key.startswith(RESERVED_ENV_PREFIX):
            raise ValueError("reserved keys must start with QL3_")
    merged.update(reserved)
    return merged


# An RFC 3339 instant (section 5.6 date-time), with ``T`` and an offset (``Z`` or ±hh:mm):
# what ``GET /api/v1/runs?since=&until=`` take (docs/api.md §6). Python's fromisoformat takes
# far more (a date alone, no offset, a space, week dates) and less (a leap second, a fraction
# of 10 digits), so the shape is matched here and each part checked as RFC 3339 says: an
# hour to 23, a minute to 59, a second to 60 (a leap second), an offset to 23:59. The CLI
# client reads a --since or --until instant with this function too.
_RFC3339 = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)
RFC3339_EXAMPLE = "2026-12-07T03:00:00+08:00"


def rfc3339_ms(text: str) -> int | None:
    """Milliseconds since the epoch of an RFC 3339 instant with an offset, or None for any
    other text. A fraction of any length is cut to the millisecond (an instant within a
    millisecond is in that millisecond); a leap second (``:60``) is the last millisecond of
    the second before it (``23:59:60Z`` is ``23:59:59.999Z``), since the epoch counts none."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    day_text, hour, minute, second, fraction, sign, off_hour, off_minute = match.groups()
    try:
        day = datetime.fromisoformat(day_text).replace(tzinfo=UTC)  # a month 13, a Feb 30
    except ValueError:
        return None
    h, m, s = int(hour), int(minute), int(second)
    oh, om = int(off_hour or 0), int(off_minute or 0)
    if h > 23 or m > 59 or s > 60 or oh > 23 or om > 59:
        return None
    ms = 999 if s == 60 else int(((fraction or "") + "000")[:3])
    offset = (oh * 60 + om) * 60_000 * (-1 if sign == "-" else 1)
    days = (day - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(days=1)
    return days * 86_400_000 + ((h * 60 + m) * 60 + min(s, 59)) * 1000 + ms - offset


def parse_instant(text: str, *, field: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 instant with an offset (``rfc3339_ms``);
    ValidationFailed naming ``field`` and the rule (never the value) otherwise."""
    rule = f"{field} must be an RFC 3339 instant with an offset, such as {RFC3339_EXAMPLE}"
    at = rfc3339_ms(text) if isinstance(text, str) else None
    if at is None:
        if isinstance(text, str) and rfc3339_ms(text.replace(" ", "+")) is not None:
            rule += " (a + in a URL's query reads as a space: write it %2B)"
        raise ValidationFailed(ErrorCode.VALIDATION_FAILED, rule)
    return at
