"""Human-readable output of the client commands: tables, times, one-line messages.

Pure functions (tests/unit/test_cli_client_render.py). Every string the server sends back
(task names, details, error codes) is made safe for a terminal first: control characters
would otherwise let a crafted name move the cursor or rewrite the screen.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any

_ELLIPSIS = "…"
# An attempt's (and a run's) endings (docs/api.md §6).
ENDED = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})


def gap_of(log: dict[str, Any]) -> int | None:
    """Where a log lost its dropped bytes when its tail follows the gap (``dropped_at`` below
    its size); None when the dropped bytes were its end, or an older api did not say."""
    gap, size = log.get("dropped_at"), log.get("bytes", 0)
    ok = type(gap) is int and type(size) is int and 0 <= gap < size
    return gap if ok else None


def head_only(attempt: Mapping[str, Any]) -> bool:
    """A log said truncated while its job still runs, nothing counted yet: it holds the
    output's head, and of the output past it the shim keeps only the last bytes, added when
    the job ends; the count of the dropped ones comes then (docs/disk-full-and-readiness.md)."""
    log = attempt.get("log") or {}
    running = attempt.get("status") not in ENDED
    return bool(log.get("truncated")) and running and not log.get("dropped_bytes")


HEAD_ONLY = "of the output past them only the last bytes are kept, added when the job ends"


def safe(text: object) -> str:
    """``text`` with every control or format character shown as ``\\xNN`` / ``\\uNNNN``."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


# A job's output on a terminal (``runs logs``, a follow): colours (SGR: ``ESC [ ... m``) pass,
# and the erase to the line's end that grep and gcc send with them (``ESC [ K``), as do
# newline, tab and carriage return (progress bars); every other C0/C1 control character, the
# ESC of any other sequence included, is shown as ``\xNN``. An OSC could otherwise set the
# clipboard (OSC 52) or the window title, a DCS or a CSI query make the terminal type an
# answer into the operator's shell, a cursor move rewrite lines already shown.
_PARAMS = 256  # a 24-bit foreground and background colour is about 40
_TERMINAL = re.compile(
    rf"(\x1b\[[0-9;:]{{0,{_PARAMS}}}m|\x1b\[[012]?K)|([\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f])"
)
# What may still become a colour (or an erase) once the next chunk comes: held at its end.
_COLOUR_START = re.compile(rf"\x1b(\[[0-9;:]{{0,{_PARAMS}}})?\Z")


def _shown(match: re.Match[str]) -> str:
    return match.group(1) or f"\\x{ord(match.group(2)):02x}"


class TerminalText:
    """A job's output made safe for a terminal, chunk by chunk (a colour split across two
    chunks still passes): ``feed`` each chunk, ``end`` once the output ends."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        """What of ``held + text`` can be shown now."""
        text, self._held = self._held + text, ""
        if (start := _COLOUR_START.search(text)) is not None:
            text, self._held = text[: start.start()], text[start.start() :]
        return _TERMINAL.sub(_shown, text)

    def end(self) -> str:
        """What was held back, shown (no colour can complete it now)."""
        text, self._held = self._held, ""
        return _TERMINAL.sub(_shown, text)


def terminal_text(text: str) -> str:
    """A whole output made safe for a terminal (``TerminalText``)."""
    out = TerminalText()
    return out.feed(text) + out.end()


def one_line(text: object, *, limit: int = 300) -> str:
    """``text`` on one line (runs of whitespace become one space), safe, at most ``limit``."""
    flat = safe(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + _ELLIPSIS


def when(ms: int | None, *, tz: tzinfo | None = None) -> str:
    """Epoch milliseconds as local ``YYYY-MM-DD HH:MM:SS`` (``-`` for none)."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone(tz)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def duration(start_ms: int | None, end_ms: int | None) -> str:
    """``1h02m``, ``3m05s``, ``4.2s`` between two instants; ``-`` when either is missing."""
    if start_ms is None or end_ms is None:
        return "-"
    seconds = max(0, end_ms - start_ms) / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, width: int = 40) -> str:
    """Left-aligned columns separated by two spaces; cells cut at ``width`` characters."""
    cells = [[one_line("-" if c is None else c, limit=width) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = [headers, *cells]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in lines
    )


def fields(pairs: Sequence[tuple[str, object]]) -> str:
    """``key: value`` lines with the values aligned."""
    pad = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(
        f"{(k + ':' if k else '').ljust(pad + 1)} {one_line(v, limit=500)}" for k, v in pairs
    )


# An attempt's status in the words a user reads (the web UI's too, docs/ui.md): ``claimed``
# is the service's name for an attempt that waits in the queue, not yet handed to the worker
# (its run is ``queued``; a retry waits for its instant). ``starting`` is taken: the worker
# is launching it. ``--json`` keeps the API's names (the contract, docs/api.md §2).
# ``timed_out`` reads "timed out", as in the UI, for a run and an attempt alike.
_STATUS_WORDS = {"timed_out": "timed out"}
_ATTEMPT_WORDS = {"claimed": "waiting", **_STATUS_WORDS}


def status_words(status: object) -> str:
    """A run's status as a reader says it (``timed out``); ``--json`` keeps the API's name."""
    return _STATUS_WORDS.get(str(status), str(status))


def attempt_status(attempt: Mapping[str, Any]) -> str:
    """``waiting`` for a claimed attempt, ``timed out``, else its status as the API names it."""
    status = str(attempt.get("status"))
    return _ATTEMPT_WORDS.get(status, status)


def attempt_outcome(attempt: Mapping[str, Any] | None) -> str:
    """``exit 0``, ``signal 9``, ``EXECUTOR_START_FAILED`` or ``-`` for an attempt."""
    if not attempt:
        return "-"
    parts = []
    if attempt.get("exit_code") is not None:
        parts.append(f"exit {attempt['exit_code']}")
    if attempt.get("signal") is not None:
        parts.append(f"signal {attempt['signal']}")
    if attempt.get("error_code"):
        parts.append(str(attempt["error_code"]))
    return ", ".join(parts) or "-"


def trigger(run: Mapping[str, Any]) -> str:
    """``manual`` or ``schedule NAME``."""
    trig = run.get("trigger") or {}
    if trig.get("kind") == "schedule":
        return f"schedule {trig.get('schedule') or '?'}"
    return str(trig.get("kind") or "manual")


def _slot(run: Mapping[str, Any], tz: tzinfo | None) -> str:
    """``, slot 2026-12-03 03:00:00`` for a scheduled run: the slot it is the run of."""
    slot = (run.get("trigger") or {}).get("slot_ms")
    return "" if slot is None else f", slot {when(slot, tz=tz)}"


def runs_table(runs: Sequence[Mapping[str, Any]], *, tz: tzinfo | None = None) -> str:
    """The ``runs list`` table, in the API's order (newest first)."""
    rows = [
        (
            r["id"],
            r["task"],
            r["revision"],
            status_words(r["status"]),
            when(r.get("created_at_ms"), tz=tz),
            duration(r.get("started_at_ms"), r.get("finished_at_ms")),
            attempt_outcome(r.get("latest_attempt")),
        )
        for r in runs
    ]
    return table(("RUN", "TASK", "REV", "STATUS", "CREATED", "TOOK", "OUTCOME"), rows)


# Why a launch failed, from the codes on its attempt's ending event (docs/cli.md): the
# reason the worker or its shim gave and, when a system call failed, its errno name.
_START_FAILURES = {
    ("EXEC_FAILED", "ENOENT"): (
        "the program, or the interpreter its #! line names, was not found (a script with"
        " Windows line ends names one with a carriage return)"
    ),
    ("EXEC_FAILED", "EACCES"): "the program may not be run (permission denied)",
    ("EXEC_FAILED", "ENOEXEC"): (
        "the program is not in a format this host can run (a script without its #! line?)"
    ),
    ("EXEC_FAILED", "ENOTDIR"): "a part of the program's path is not a directory",
    ("CWD_INVALID", "ENOENT"): "the working directory does not exist",
    ("CWD_INVALID", "EACCES"): "the working directory may not be entered (permission denied)",
    ("CWD_INVALID", "ENOTDIR"): "the working directory is not a directory",
}
_START_FAILURE_REASONS = {
    "RUN_AS_NOT_ALLOWED": "the job's user is not allowed on this host (QL_JOB_USERS)",
    "LOG_OPEN_FAILED": "the run's log could not be opened",
    "RECEIPT_DIR_FAILED": "the worker could not make the run's receipt directory",
    "RECEIPT_RESERVE_FAILED": "the worker could not make the run's receipt file",
    "WORKER_LEASE_LOST": "the worker was stopping (it lost its lease)",
}


def start_failure(data: Mapping[str, Any]) -> str:
    """Why an attempt never ran, from its ending event's data: ``EXEC_FAILED EACCES: the
    program may not be run (permission denied)`` (the codes alone when there are no words
    for them), or which secret is missing; "" when the event has neither."""
    secret = data.get("secret")
    if isinstance(secret, str) and secret:
        return safe(f"secret {secret} does not exist; set it with `qinglong secrets set {secret}`")
    reason, errno_name = data.get("start_failure"), data.get("errno")
    if not isinstance(reason, str) or not reason:
        return ""
    errno_name = errno_name if isinstance(errno_name, str) else None
    codes = f"{reason} {errno_name}" if errno_name else reason
    words = _START_FAILURES.get((reason, errno_name or "")) or _START_FAILURE_REASONS.get(reason)
    return safe(f"{codes}: {words}" if words else codes)


def waiting_words(waiting: Mapping[str, Any]) -> str:
    """What holds a queued run back, in words (docs/concurrency-budgets.md §2)."""
    reason, limit, active = waiting.get("reason"), waiting.get("limit"), waiting.get("active")
    are = "is" if active == 1 else "are"
    if reason == "max_running":
        runs = "run" if active == 1 else "runs"
        return f"for a free slot: {active} {runs} {are} active, QL_MAX_RUNNING allows {limit}"
    if reason == "max_concurrent":
        return f"for its task: {active} of its runs {are} active, its revision allows {limit}"
    if reason == "held":
        return "behind an older run of its schedule that has not ended (queue_one, replace)"
    if reason == "worker":
        return "for the worker: the service's last try to start a run found none answering"
    if reason == "disk":
        return "for free space: the service's last try found too little (system ready says)"
    return safe(str(reason))  # a reason a later service names


def run_fields(
    run: Mapping[str, Any],
    *,
    tz: tzinfo | None = None,
    why_not_started: str = "",
    cancel_reason: str | None = None,
    leftovers_stopped: int = 0,
) -> str:
    """The ``runs show`` block of one run; ``why_not_started``: ``start_failure``'s words for
    a latest attempt whose launch failed; ``cancel_reason``: the cancel's reason, when its
    event tells more than the run (``service_stop``); ``leftovers_stopped``: the processes
    the job left that were stopped when it ended (docs/leftovers.md), from its event."""
    attempt = run.get("latest_attempt") or {}
    cancel = run.get("cancel_requested")
    log = attempt.get("log") or {}
    pairs: list[tuple[str, object]] = [
        ("run", run["id"]),
        ("task", f"{run['task']} (revision {run['revision']})"),
        ("status", status_words(run["status"])),
        ("trigger", trigger(run) + _slot(run, tz)),
        ("priority", run.get("priority")),
        ("created", when(run.get("created_at_ms"), tz=tz)),
        ("started", when(run.get("started_at_ms"), tz=tz)),
        ("finished", when(run.get("finished_at_ms"), tz=tz)),
        ("took", duration(run.get("started_at_ms"), run.get("finished_at_ms"))),
    ]
    rerun_of = (run.get("trigger") or {}).get("rerun_of")
    if rerun_of:
        pairs.insert(4, ("rerun of", rerun_of))
    if run.get("pinned"):
        pairs.append(("pinned", "yes: retention keeps its log and rows"))
    if cancel:
        reason = cancel_reason or cancel.get("reason")
        said = "service_stop (serve --stop-jobs-on-exit)" if reason == "service_stop" else reason
        pairs.append(("cancel", f"{said} at {when(cancel.get('at_ms'), tz=tz)}"))
    if run.get("waiting"):
        pairs.insert(3, ("waiting", waiting_words(run["waiting"])))
    waits_until = run.get("next_attempt_at_ms")  # a retry waits (docs/retries.md §2)
    if attempt:
        outcome = attempt_outcome(attempt) + (f" ({why_not_started})" if why_not_started else "")
        if waits_until is not None and outcome == "-":
            # Past its instant it waits for something else (a budget, the worker): "due".
            due = waits_until <= _now_ms()
            outcome = f"a retry, {'due since' if due else 'waits until'} {when(waits_until, tz=tz)}"
        said = "" if outcome == "-" else f": {outcome}"  # none yet: waiting or running
        pairs.append(("attempt", f"{attempt['number']} {attempt_status(attempt)}{said}"))
        if leftovers_stopped > 0:
            many = "processes" if leftovers_stopped > 1 else "process"
            pairs.append(("stopped", (
                f"{leftovers_stopped} {many} the job left running, when it ended (a revision "
                "with --leftovers keep lets them live)"
            )))  # fmt: skip
        size = f"{log.get('bytes', 0)} bytes"
        if head_only(attempt):
            size += f", the output's first: {HEAD_ONLY}"
        elif log.get("truncated"):
            reason = log.get("truncation_reason") or "quota"
            gap, dropped = gap_of(log), log.get("dropped_bytes", 0)
            if gap is None:
                size += f", truncated ({dropped} bytes dropped: {reason})"
            else:
                end = log.get("bytes", 0) - gap
                size += (
                    f", truncated ({dropped} bytes dropped at byte {gap}: {reason}; "
                    f"the last {end} bytes are the output's end)"
                )
        if log.get("expired"):  # the size is what it was; the file is gone (410 LOG_EXPIRED)
            size += f", expired {when(log.get('expired_at_ms'), tz=tz)}: retention removed it"
        pairs.append(("log", size))
    return fields(pairs)


def attempts_table(attempts: Sequence[Mapping[str, Any]], *, tz: tzinfo | None = None) -> str:
    """The attempts of one run."""
    rows = [
        (
            a["number"],
            attempt_status(a),
            when(a.get("started_at_ms"), tz=tz),
            duration(a.get("started_at_ms"), a.get("finished_at_ms")),
            attempt_outcome(a),
        )
        for a in attempts
    ]
    return table(("ATTEMPT", "STATUS", "STARTED", "TOOK", "OUTCOME"), rows)


def tasks_table(tasks: Sequence[Mapping[str, Any]]) -> str:
    """The ``tasks list`` table."""
    return table(("TASK", "LATEST"), [(t["task"], t["latest_revision"]) for t in tasks])


def archived_tasks_table(tasks: Sequence[Mapping[str, Any]]) -> str:
    """The ``tasks list --archived`` / ``--all`` table: when each was archived (``-``: not)."""
    rows = [(t["task"], t["latest_revision"], when(t.get("archived_at_ms"))) for t in tasks]
    return table(("TASK", "LATEST", "ARCHIVED"), rows)


def secrets_table(secrets: Sequence[Mapping[str, Any]]) -> str:
    """The ``secrets list`` table: names and when each was last set, never a value."""
    rows = [(s["name"], when(s.get("updated_at_ms"))) for s in secrets]
    return table(("SECRET", "UPDATED"), rows)


def task_fields(
    task: Mapping[str, Any],
    *,
    recipe: Mapping[str, Any] | None = None,
    tz: tzinfo | None = None,
) -> str:
    """The ``tasks show`` block: the task and its latest revision (the recipe's env keys and
    secret names, never a value)."""
    rev = task.get("latest") or {}
    pairs: list[tuple[str, object]] = [
        ("task", task["task"]),
        ("latest revision", task["latest_revision"]),
        ("archived", when(task.get("archived_at_ms"), tz=tz)),
        ("argv", " ".join(_quote(a) for a in rev.get("argv", []))),
        ("cwd", rev.get("cwd") or "-"),
        ("recipe", rev.get("recipe") or "-"),
        *_recipe_pairs(recipe),
        ("timeout", f"{rev['timeout_seconds']} s" if rev.get("timeout_seconds") else "-"),
        ("priority", rev.get("priority", 0)),
        ("leftovers", rev.get("leftovers", "kill")),
        ("max concurrent", rev.get("max_concurrent") or "-"),
        ("run as", rev.get("run_as") or "-"),
        ("retry", retry_policy(rev.get("retry"))),
        ("digest", rev.get("digest", "-")),
        ("created", when(rev.get("created_at_ms"), tz=tz)),
    ]
    return fields(pairs)


def _recipe_pairs(recipe: Mapping[str, Any] | None) -> list[tuple[str, object]]:
    if recipe is None:
        return []
    env = ", ".join(recipe.get("env") or {}) or "-"
    secrets = ", ".join(f"{k} ({v})" for k, v in (recipe.get("secrets") or {}).items()) or "-"
    return [("env keys", env), ("secrets", secrets)]


def events_table(events: Sequence[Mapping[str, Any]], *, tz: tzinfo | None = None) -> str:
    """The ``runs events`` table: seq, time, type and the low-sensitivity data as k=v."""
    rows = [
        (
            e["seq"],
            when(e.get("at_ms"), tz=tz),
            e["type"],
            _data(e.get("data"), tz=tz),
        )
        for e in events
    ]
    return table(("SEQ", "AT", "TYPE", "DATA"), rows, width=80)


def decisions_table(decisions: Sequence[Mapping[str, Any]], *, tz: tzinfo | None = None) -> str:
    """The ``schedules decisions`` table: slot, decision, the run it names and, for
    ``missed``, how many slots up to which."""
    rows = []
    for d in decisions:
        note = "-"
        if d.get("decision") == "missed":
            note = f"{d.get('count')} slots, to {when(d.get('until_slot_ms'), tz=tz)}"
        rows.append(
            (when(d.get("slot_ms"), tz=tz), d["decision"], d.get("run") or "-", note,
             when(d.get("at_ms"), tz=tz))
        )  # fmt: skip
    return table(("SLOT", "DECISION", "RUN", "MISSED", "DECIDED"), rows)


_EPOCH_MS_FROM = 10**12  # 2001-09-09: a ``*_ms`` value past it is an instant, not a span


def _data(data: Mapping[str, Any] | None, *, tz: tzinfo | None = None) -> str:
    """``k=v`` pairs, nulls left out; an instant (``not_before_ms``) as a local time."""
    pairs = []
    for k, v in (data or {}).items():
        if v is None:
            continue
        if k.endswith("_ms") and isinstance(v, int) and v >= _EPOCH_MS_FROM:
            k, v = k.removesuffix("_ms"), when(v, tz=tz).replace(" ", "T")
        pairs.append(f"{k}={v}")
    return " ".join(pairs) or "-"


def retry_policy(retry: Mapping[str, Any] | None) -> str:
    """``3 attempts on failed, lost; waits 10s x2 up to 600s, jittered`` or ``-``."""
    if not retry or int(retry.get("max_attempts") or 1) <= 1:
        return "-"
    on = ", ".join(retry.get("on") or ["failed"])
    jitter = ", jittered" if retry.get("jitter", True) else ""
    first, factor, cap = (
        float(retry.get(k) or 0) for k in ("initial_delay_seconds", "factor", "max_delay_seconds")
    )
    return (
        f"{retry['max_attempts']} attempts on {on}; waits {first:g}s x{factor:g} up to "
        f"{cap:g}s{jitter}"
    )


def revisions_table(revisions: Sequence[Mapping[str, Any]], *, tz: tzinfo | None = None) -> str:
    """The ``tasks revisions`` table, newest first (the digest cut to its first 12 hex)."""
    rows = [
        (
            r["revision"],
            when(r.get("created_at_ms"), tz=tz),
            str(r.get("digest", "-"))[:19],
            "yes" if r.get("recipe") else "-",
            " ".join(_quote(a) for a in r.get("argv", [])),
        )
        for r in revisions
    ]
    return table(("REV", "CREATED", "DIGEST", "RECIPE", "ARGV"), rows, width=60)


def retention_table(policy: Mapping[str, Any]) -> str:
    """The ``tasks retention`` table: each field's own value (or global) and the one in force."""
    override = policy.get("override") or {}
    effective = policy.get("effective") or {}

    def shown(field: str, value: Any) -> object:  # bytes as the storage figures show them
        return size(value) if field == "task_log_bytes" else value

    rows = [
        (
            field.replace("_", "-"),
            "global" if override.get(field) is None else shown(field, override[field]),
            "no limit" if effective.get(field) is None else shown(field, effective[field]),
        )
        for field in ("keep_runs", "keep_days", "keep_rows", "task_log_bytes")
    ]
    shown_table = table(("FIELD", "TASK'S OWN", "IN FORCE"), rows)
    if policy.get("retention_enabled") is False:  # an older server sends no such field
        shown_table += (
            "\nretention is off on this service (QL_RETENTION=off): no sweep runs, so nothing"
            " is deleted whatever is in force"
        )
    return f"task {safe(policy['task'])}\n" + shown_table


def size(n: int | None) -> str:
    """``1.5 MiB (1572864 bytes)``; ``-`` for none."""
    if n is None:
        return "-"
    value, unit = float(n), "bytes"
    for name in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, name
    return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit} ({n} bytes)"


_HELD_BY = {
    "pids_max": "per job, by its cgroup's pids.max",
    "rlimit_nproc": "per job user, by RLIMIT_NPROC across that user's running jobs",
    "rlimit_nproc_run_as": "per run_as job user, by RLIMIT_NPROC; other jobs have none",
    "none": "set but not enforced here (docs/job-user.md)",
}


def process_limit_line(limit: Mapping[str, Any] | None) -> str | None:
    """``/readyz``'s ``process_limit`` as a line (docs/job-user.md), or None when the worker
    did not say (an older one) or the answer has another shape."""
    if not isinstance(limit, Mapping):
        return None
    held, most = limit.get("held_by"), limit.get("max_processes")
    if held == "off":
        return "process limit: off (QL_JOB_MAX_PROCESSES=off)"
    if held not in _HELD_BY or not isinstance(most, int):
        return None
    return f"process limit: {most} {_HELD_BY[held]}"


def token_fields(token: Mapping[str, Any], *, tz: tzinfo | None = None) -> str:
    """The ``system token`` block: the calling token's name, scopes and expiry."""
    expires = token.get("expires_at_ms")
    return fields([
        ("name", safe(token.get("name"))),
        ("scopes", safe(" ".join(token.get("scopes") or ())) or "-"),
        ("expires", when(expires, tz=tz) if isinstance(expires, int) else "never (until revoked)"),
    ])


def storage_fields(storage: Mapping[str, Any], *, tz: tzinfo | None = None) -> str:
    """The ``system storage`` block (docs/retention.md)."""
    sweep = storage.get("last_sweep")
    pairs: list[tuple[str, object]] = [
        ("retention", "on" if storage.get("retention_enabled") else "off"),
        ("log bytes", size(storage.get("log_bytes"))),
        ("log budget", size(storage.get("total_log_bytes_budget"))),
        ("logs kept", storage.get("logs_kept")),
        ("logs expired", storage.get("logs_expired")),
        ("runs kept", storage.get("runs_kept")),
        ("free", size(storage.get("free_bytes"))),
        ("reserve", size(storage.get("reserve_bytes"))),
    ]
    # Each host's last sweep with several hosts (a host whose sweeps stopped is the oldest
    # line); an older server sends ``last_sweep`` alone.
    sweeps = storage.get("sweeps") or ([sweep] if sweep else [])
    for one in sweeps:
        what = f"{when(one['at_ms'], tz=tz)} in {one['duration_ms']} ms: "
        logs, runs = one["expired_logs"], one["deleted_runs"]
        what += f"{logs} log{'' if logs == 1 else 's'} expired, "
        what += f"{runs} run{'' if runs == 1 else 's'} deleted, "
        what += f"{size(one['freed_bytes'])} freed"
        host = one.get("host") or one.get("instance_id")
        if len(sweeps) == 1:
            pairs.append(("last sweep", what + (f" (host {safe(host)})" if host else "")))
        else:
            pairs.append((f"sweep of {safe(host or 'an older build')}", what))
    if not sweeps:
        pairs.append(("last sweep", "none yet"))
    return fields(pairs)


def every(schedule: Mapping[str, Any]) -> str:
    """``every 60s`` or ``cron 0 * * * *`` for a schedule."""
    if schedule.get("every_seconds"):
        return f"every {schedule['every_seconds']}s"
    return "cron " + " | ".join(schedule.get("cron") or [])


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def schedule_state(schedule: Mapping[str, Any], *, now_ms: int | None = None) -> str:
    """``paused``, ``ended`` (its ``end_at_ms`` passed: no slot is left) or ``active``."""
    if schedule.get("paused"):
        return "paused"
    end = schedule.get("end_at_ms")
    now = _now_ms() if now_ms is None else now_ms
    return "ended" if end is not None and end < now else "active"


def _next(schedule: Mapping[str, Any], tz: tzinfo | None) -> str:
    """The next fire in the schedule's own zone with its offset, beside the ZONE column (the
    client's local time there read as the zone's); ``-`` when no slot is left. A paused
    schedule's says ``if resumed``: it fires then only if resumed by then."""
    fires = schedule.get("next_fires") or []
    if not fires:
        return "-"
    local = fires[0].get("local")
    at = safe(str(local).replace("T", " ")) if local else when(fires[0]["at_ms"], tz=tz)
    return f"{at} if resumed" if schedule.get("paused") else at


def schedules_table(schedules: Sequence[Mapping[str, Any]], *, tz: tzinfo | None = None) -> str:
    """The ``schedules list`` table."""
    rows = [
        (
            s["name"],
            s["task"],
            every(s),
            s.get("timezone"),
            schedule_state(s),
            _next(s, tz),
        )
        for s in schedules
    ]
    return table(("SCHEDULE", "TASK", "WHEN", "ZONE", "STATE", "NEXT"), rows)


def schedule_fields(schedule: Mapping[str, Any], *, tz: tzinfo | None = None) -> str:
    """The ``schedules show`` block, with the next fire times in local time and the zone's."""
    rev = schedule.get("revision")
    overlap = str(schedule.get("overlap"))
    if overlap == "allow":  # the only policy max_concurrent acts under
        overlap += f" (max {schedule.get('max_concurrent')})"
    catchup = str(schedule.get("catchup"))
    if catchup == "latest":  # the only policy the window bounds (docs/schedules-time.md §4)
        catchup += f" within {schedule.get('catchup_window_seconds')} s"
    dst = (  # an interval never meets a DST gap or fold
        [("dst", f"gap {schedule.get('dst_gap')}, fold {schedule.get('dst_fold')}")]
        if schedule.get("cron") else []
    )  # fmt: skip
    pairs: list[tuple[str, object]] = [
        ("schedule", schedule["name"]),
        ("task", f"{schedule['task']} ({'latest' if rev is None else f'revision {rev}'})"),
        ("when", every(schedule)),
        ("zone", schedule.get("timezone")),
        ("state", schedule_state(schedule)),
        ("overlap", overlap),
        ("catch-up", catchup),
        ("jitter", f"{schedule.get('jitter_seconds', 0)} s"),
        *dst,
        ("version", schedule.get("version")),
        ("updated", when(schedule.get("updated_at_ms"), tz=tz)),
    ]

    bounds = [
        f"{label} {when(schedule[key], tz=tz)}"
        for label, key in (("from", "start_at_ms"), ("until", "end_at_ms"))
        if schedule.get(key) is not None
    ]
    if bounds:
        pairs.insert(4, ("bounds", ", ".join(bounds)))
    # A paused schedule fires none of them unless resumed first.
    label = "next if resumed" if schedule.get("paused") else "next"
    for i, fire in enumerate(schedule.get("next_fires") or []):
        pairs.append((label if i == 0 else "", f"{when(fire['at_ms'], tz=tz)}  ({fire['local']})"))
    return fields(pairs)


def _quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "-_./=:,+@%" for c in arg):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"
