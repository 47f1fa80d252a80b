"""Request bodies the client commands build from their arguments (docs/cli.md §3).

Pure functions (tests/unit/test_cli_client.py): flags and a revision file become the JSON
documents of docs/api.md §4 and §10. The api checks every rule; these only shape the body
and refuse what cannot be said at all (``KEY=VALUE`` without ``=``, a file that is not a
JSON object), as usage errors before anything is sent.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.cli.client.api import EXIT_USAGE, ClientError
from app.cli.client.render import safe
from app.domain.ids import utc_instant
from app.domain.validation import rfc3339_ms  # the api's own reading of an instant

# docs/api.md §1: env keys; a secret's derived key must be one too.
_ENV_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")
# The api's name rule (NAME_RULE in app/domain/validation.py, which the client does not
# load; a unit test keeps them equal). The api still decides: this only spares typing a
# secret's value for a name it would refuse.
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
RETENTION_FIELDS = ("keep_runs", "keep_days", "keep_rows", "task_log_bytes")
# The flags of `tasks put` and the revision field each sets.
REVISION_FLAGS = {
    "cwd": "cwd",
    "timeout": "timeout_seconds",
    "priority": "priority",
    "max_concurrent": "max_concurrent",
    "leftovers": "leftovers",
    "run_as": "run_as",
}
RETRY_FLAGS = {
    "retry_max_attempts": "max_attempts",
    "retry_delay": "initial_delay_seconds",
    "retry_max_delay": "max_delay_seconds",
    "retry_factor": "factor",
    "retry_on": "on",
}


def usage(message: str) -> ClientError:
    """A usage problem (exit 2), reported before any request."""
    return ClientError(message, EXIT_USAGE)


def key_values(pairs: Sequence[str], *, flag: str) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` → ``{"A": "1", "B": "x=y"}``; a key given twice is refused."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise usage(f"{flag} takes KEY=VALUE (got one without a key or '=')")
        if key in out:
            raise usage(f"{flag} names the key {key} twice")
        out[key] = value
    return out


def secret_refs(refs: Sequence[str]) -> dict[str, str]:
    """``--secret`` values → the recipe's ``{"ENV_KEY": "secret-name"}``.

    ``KEY=NAME`` maps a key to a secret; a bare ``NAME`` gets its key from the name
    (``db-password`` → ``DB_PASSWORD``). Secret values never appear here (docs/api.md §5).
    """
    out: dict[str, str] = {}
    for ref in refs:
        key, sep, name = ref.partition("=")
        if not sep:
            name = ref
            key = re.sub(r"[.-]", "_", ref.upper())
            if not _ENV_KEY.fullmatch(key):
                raise usage(
                    f"--secret {ref}: no environment key follows from this name; "
                    "give it as --secret KEY=NAME"
                )
            if not NAME.fullmatch(name):  # the api would refuse it (422): say what to send
                like = name.lower()  # NAME allows '_': the same key follows from it
                raise usage(
                    f"--secret {ref}: secret names are lower-case, at most 128 characters; "
                    f"for the key {key} give --secret "
                    f"{like if NAME.fullmatch(like) else key + '=NAME'}"
                )
        if not key or not name:
            raise usage("--secret takes NAME or KEY=NAME")
        if key in out:
            raise usage(f"--secret names the key {key} twice")
        out[key] = name
    return out


def recipe_body(env: Sequence[str], secrets: Sequence[str]) -> dict[str, Any] | None:
    """The ``POST /recipes`` body for ``--env`` and ``--secret``; None when neither is given."""
    if not env and not secrets:
        return None
    return {"env": key_values(env, flag="--env"), "secrets": secret_refs(secrets)}


# What the api prints of a revision beside its body (``RevisionOut``): facts of the stored
# revision, never part of a new one. The number is ``--revision`` or the next one.
REVISION_OUTPUT_ONLY = ("task", "revision", "digest", "created_at_ms")


# NaN, Infinity and a number past a double's range (1e999, read as inf): Python's json reads
# them, JSON (RFC 8259 §6) has none, and a body holding one could not be sent.
def finite_number(text: str) -> float:
    """``text`` as a finite float, else ValueError (a flag's value, a body file's number)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _json_object(text: str, *, source: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object, or a usage error naming ``source`` and ``what`` it should be."""
    try:  # a byte order mark (Notepad's "UTF-8 with BOM") is no part of the JSON: RFC 8259 §8.1
        doc = json.loads(
            text.removeprefix("\ufeff"), parse_constant=_no_constant, parse_float=finite_number
        )
    except json.JSONDecodeError as exc:
        raise usage(f"{source} is not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # one of the two above
        raise usage(f"{source} is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise usage(f"{source} is not a JSON object ({what})")
    return doc


def load_revision_file(text: str, *, source: str) -> dict[str, Any]:
    """A revision file's JSON object (docs/api.md §4), as the body of a new revision.

    The file may also be what the api printed, so an edit starts from ``tasks show --json``:
    a task (its ``latest`` revision is taken) or one revision (``tasks revisions --json``'s
    items); their output-only fields are left out.
    """
    doc = _json_object(text, source=source, what="a revision body, docs/api.md §4")
    if "latest" in doc and "latest_revision" in doc:  # `tasks show --json`
        doc = doc["latest"]
        if not isinstance(doc, dict):
            raise usage(f"{source}: its latest is not a JSON object (a revision)")
    return {k: v for k, v in doc.items() if k not in REVISION_OUTPUT_ONLY}


def revision_body(
    base: Mapping[str, Any] | None,
    argv: Sequence[str],
    flags: Mapping[str, Any],
    *,
    recipe: str | None = None,
) -> dict[str, Any]:
    """The ``PUT /tasks/{task}/revisions/{n}`` body: ``base`` (a file), then the flags.

    A flag that is given (not None) replaces the file's field; argv after ``--`` replaces
    the file's argv; ``recipe`` (made from ``--env``/``--secret``) replaces its recipe.
    """
    body = dict(base or {})
    if argv:
        body["argv"] = list(argv)
    if not body.get("argv"):
        raise usage(
            "no command: give it after -- (qinglong tasks put TASK -- /bin/sh -c '...') "
            "or as argv in --file"
        )
    for flag, field in REVISION_FLAGS.items():
        if flags.get(flag) is not None:
            body[field] = flags[flag]
    retry = {f: flags[k] for k, f in RETRY_FLAGS.items() if flags.get(k) is not None}
    if flags.get("retry_jitter") or flags.get("retry_no_jitter"):
        retry["jitter"] = bool(flags.get("retry_jitter"))
    if retry:
        base_retry = body.get("retry")
        body["retry"] = (dict(base_retry) if isinstance(base_retry, dict) else {}) | retry
        if set(retry) - {"max_attempts"} and body["retry"].get("max_attempts", 1) == 1:
            raise usage(
                "a retry flag without --retry-max-attempts N (2 or more) does nothing: with one "
                "attempt in all there is no retry"
            )
    if recipe is not None:
        if body.get("recipe") not in (None, recipe):
            raise usage(
                "--env/--secret make a new recipe, which would replace the whole of the one "
                'the file names; delete "recipe" from the file and give every key again '
                "with --env/--secret (its keys: qinglong tasks show TASK)"
            )
        body["recipe"] = recipe
    return body


def retention_value(text: str) -> int | None:
    """A retention flag's value: a whole number ≥ 0, or ``default`` (the global value)."""
    if text == "default":
        return None
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def retention_body(
    current: Mapping[str, Any], changes: Mapping[str, Any], *, clear: bool
) -> dict[str, Any]:
    """The ``PUT /tasks/{task}/retention`` body: the stored override with ``changes``.

    The PUT replaces every field, so the fields not named keep their stored value; ``clear``
    starts from none (every field the global value). ``changes`` maps a field to its new
    value (None: the global value); a field absent from it is unchanged.
    """
    body = {f: None if clear else current.get(f) for f in RETENTION_FIELDS}
    for field, value in changes.items():
        if field not in RETENTION_FIELDS:
            raise usage(f"unknown retention field {field}")
        body[field] = value
    return body


# ``schedules put`` flags and the body field each replaces (docs/api.md §9).
SCHEDULE_FLAGS = {
    "task": "task",
    "revision": "revision",
    "every_seconds": "every_seconds",
    "timezone": "timezone",
    "overlap": "overlap",
    "max_concurrent": "max_concurrent",
    "catchup": "catchup",
    "catchup_window": "catchup_window_seconds",
    "jitter": "jitter_seconds",
}
# What the api prints of a schedule beside its definition.
SCHEDULE_OUTPUT_ONLY = ("name", "version", "created_at_ms", "updated_at_ms", "next_fires")


def load_schedule_file(text: str, *, source: str) -> dict[str, Any]:
    """A schedule file's JSON object (docs/api.md §9); what ``schedules show --json``
    printed is taken too, without its output-only fields."""
    doc = _json_object(text, source=source, what="a schedule body, docs/api.md §9")
    return {k: v for k, v in doc.items() if k not in SCHEDULE_OUTPUT_ONLY}


_ALL_UNDER = {
    "skip": "only the oldest missed slot runs, the others skipped_overlap",
    "queue_one": "only the two oldest missed slots run, the others skipped_overlap",
    "replace": "only the newest slot runs, the older ones cancelled",
}


def catchup_all_warning(body: Mapping[str, Any]) -> str | None:
    """What ``catchup: all`` does under an overlap policy that keeps one run at a time
    (docs/schedules.md §3): not every missed slot runs. None when it does as it says."""
    if body.get("catchup") != "all":
        return None
    overlap = body.get("overlap") or "skip"
    limit = body.get("max_concurrent") or 1
    what = _ALL_UNDER.get(overlap) if overlap != "allow" else (
        _ALL_UNDER["skip"] if limit == 1 else None
    )  # fmt: skip
    if what is None:
        return None
    return (
        f"warning: --catchup all decides each missed slot under --overlap {overlap}"
        f"{' --max-concurrent 1' if overlap == 'allow' else ''}, so {what}; to run every one "
        "use --overlap allow --max-concurrent N (docs/schedules.md §3)"
    )


def max_concurrent_warning(body: Mapping[str, Any]) -> str | None:
    """``max_concurrent`` above 1 under a policy it does not act under (docs/schedules.md
    §5: only ``allow`` counts it), or None."""
    overlap = body.get("overlap") or "skip"
    if (body.get("max_concurrent") or 1) > 1 and overlap != "allow":
        return (
            f"warning: --max-concurrent acts under --overlap allow only; under --overlap "
            f"{overlap} one run at a time still holds"
        )
    return None


def every_zone_warning(schedule: Mapping[str, Any]) -> str | None:
    """An ``every_seconds`` schedule whose zone's offset is not a multiple of its interval:
    its slots count from the epoch in UTC (docs/schedules-time.md §1), so they do not fall
    where the zone's clock suggests (``--every 86400`` in Asia/Shanghai fires at 08:00
    there). None when the zone changes nothing, or the answer has no next fire to judge by."""
    every, zone = schedule.get("every_seconds"), schedule.get("timezone")
    fires = schedule.get("next_fires") or []
    if not isinstance(every, int) or every <= 0 or not fires or zone in (None, "UTC"):
        return None
    if every % 86400 and 86400 % every:  # its slots move on any clock from day to day
        return None
    try:
        local = datetime.fromisoformat(str(fires[0].get("local")))
    except (ValueError, AttributeError):
        return None
    offset = local.utcoffset()
    if offset is None:
        return None
    now_off = int(offset.total_seconds()) % every != 0
    # The season's offset too: a daily slot made in a London winter falls at 01:00 in summer.
    seasons = False
    try:
        tz = ZoneInfo(str(zone))
        for month in (1, 7):
            season = datetime(local.year, month, 1, tzinfo=tz).utcoffset()
            seasons = seasons or (season is not None and int(season.total_seconds()) % every != 0)
    except (ValueError, OSError, ZoneInfoNotFoundError):
        pass
    if not now_off and not seasons:
        return None
    where = _slot_times(local, every)
    if not now_off:
        where += " now, and elsewhere on the clock while its daylight-saving time holds"
    return (
        f"warning: --every {every} counts from 1970-01-01 00:00 UTC, not from midnight in "
        f"{zone}: {where}; for a fixed local time use --cron (docs/schedules-time.md §1)"
    )


def _slot_times(local: datetime, every: int) -> str:
    """Where the slots of ``every`` seconds fall on the zone's clock, from the next one at
    ``local``: one time of day for whole days; the day's first, second and last for an
    interval a day holds a whole number of times (the only others warned of)."""
    day = 86400
    if every % day == 0:
        return f"its slots fall at {local:%H:%M:%S} there"
    first = (local.hour * 3600 + local.minute * 60 + local.second) % every
    times = [first, first + every, first + (day // every - 1) * every]
    clock = [f"{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}" for t in times]
    if day // every == 2:
        return f"its slots fall at {clock[0]} and {clock[1]} there"
    return f"its slots fall at {clock[0]}, {clock[1]}, ... {clock[2]} there"


def schedule_body(base: Mapping[str, Any] | None, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The ``PUT /schedules/{name}`` body: ``base`` (a file), then the flags.

    The PUT replaces the whole schedule: a field neither gives takes the api's default.
    ``--cron`` replaces the file's cadence (its ``every_seconds`` too) and ``--every`` the
    other way round.
    """
    body = dict(base or {})
    cron, every = flags.get("cron"), flags.get("every_seconds")
    if cron and every is not None:
        raise usage("give --cron or --every, not both")
    for flag, field in SCHEDULE_FLAGS.items():
        if flags.get(flag) is not None:
            body[field] = flags[flag]
    if flags.get("revision") == "latest":  # --revision latest: no pin, the file's dropped
        body.pop("revision")
    if cron:
        body["cron"] = list(cron)
        body.pop("every_seconds", None)
    elif every is not None:
        body.pop("cron", None)
    if flags.get("paused"):
        body["paused"] = True
    if not body.get("task") or (not body.get("cron") and body.get("every_seconds") is None):
        raise usage(
            "a schedule needs --task and --cron EXPR or --every SECONDS "
            "(qinglong schedules put NAME --task TASK --cron '0 3 * * *')"
        )
    return body


# ``runs list --since/--until`` (docs/cli.md §3): what a user types for "when", and nothing
# else. The API takes RFC 3339 instants with an offset only; each other form becomes one in
# UTC (``Z``): a local zone's offset may have seconds (Amsterdam's +00:19:32 before 1937),
# which RFC 3339 cannot say.
_AGO = re.compile(r"([0-9]+)([smhd])")
_AGO_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_AGO_DAYS = 36_500
_LOCAL_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_LOCAL_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2})?")
TIME_FORMS = (
    "2h, 30m, 1d (that long ago), 2026-12-07 (local midnight), 2026-12-07 03:00 (local time) "
    "or an instant with an offset (2026-12-07T03:00:00+08:00)"
)


def instant(text: str, *, flag: str, now_ms: int) -> tuple[str, int]:
    """A ``--since``/``--until`` value as (the RFC 3339 instant sent, its epoch ms).

    ``N`` and ``s``, ``m``, ``h`` or ``d``: that long before ``now_ms``, at most 36500 days.
    A date, or a date and ``HH:MM[:SS]`` (``T`` or a space between): local time, the zone
    the tables show, from 0001-01-02 to 9999-12-30; one a clock change skips or repeats is
    refused, as it names no one instant. The instant sent for these is in UTC. An RFC 3339
    instant with an offset: as typed, read as the api reads it. Anything else is a usage
    error naming the forms.
    """
    text = text.strip()
    if ago := _AGO.fullmatch(text):
        digits, unit = ago.groups()
        # Compared by length first: int() of thousands of digits is refused, or slow.
        if len(digits.lstrip("0")) > 12 or int(digits) * _AGO_MS[unit] > MAX_AGO_DAYS * 86_400_000:
            raise usage(f"{flag} {safe(text)}: at most {MAX_AGO_DAYS}d ago (100 years)")
        ago_ms = now_ms - int(digits) * _AGO_MS[unit]
        return utc_instant(ago_ms), ago_ms
    if (at_ms := rfc3339_ms(text)) is not None:
        return text, at_ms  # as typed: its offset is in minutes, which the api takes
    if _LOCAL_DATE.fullmatch(text) or _LOCAL_TIME.fullmatch(text):
        try:
            wall = datetime.fromisoformat(text.replace(" ", "T"))
        except ValueError:  # a month 13, a Feb 30, an hour 24
            raise usage(f"{flag} {safe(text)}: not a time; give {TIME_FORMS}") from None
        try:
            at, again = wall.replace(fold=0).astimezone(), wall.replace(fold=1).astimezone()
        except (ValueError, OverflowError, OSError):  # the first or last day of year 1..9999
            raise usage(f"{flag} {safe(text)}: {_YEARS}") from None
        if at != again or at.replace(tzinfo=None) != wall:
            raise usage(
                f"{flag} {safe(text)}: a clock change skips or repeats that local time; "
                "give the instant with its offset (2026-12-07T03:00:00+08:00)"
            )
        at_ms = _epoch_ms(at)
        return utc_instant(at_ms), at_ms
    raise usage(f"{flag} {safe(text)}: not a time; give {TIME_FORMS}")


_YEARS = (
    "out of range: give a local date or time from 0001-01-02 to 9999-12-30 (a day either "
    "side could be outside the years 1 to 9999 in UTC), or an instant with its offset"
)


def _epoch_ms(at: datetime) -> int:
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
