"""Prometheus metrics for ``GET /metrics`` (docs/metrics.md).

Two sources, so that the answer is the same whichever api process a scrape reaches:

- **The database**, read at each scrape: runs by status, ended runs by error code, the queue,
  attempts starting and running, journal entries by state, log bytes. Every api process
  reads the same rows.
- **Observations** made by the process that did the work: the dispatch pass duration,
  created→started, each schedule slot's fire lateness (the schedule loop of the api
  process whose transaction decided it), and the requests refused 503 because the database
  could not take them (the api process that refused them). Under ``qinglong api`` (several
  uvicorn workers) ``PROMETHEUS_MULTIPROC_DIR`` is set before any worker starts
  (app/cli/serve.py), so prometheus-client keeps each process's values in its own file there
  and a scrape sums them all; without it (one process, the in-process tests) they live in
  this process.

Labels are statuses, stable error codes, journal states and whether a slot was on time only:
never a task or schedule name, argv, environment value or output.

A full data disk must never kill an api process through these files (docs/metrics.md
§ A full disk): prometheus-client maps each file and writes it through the mapping; a page
of a sparse file that the file system cannot back then raises SIGBUS, not an error. So this
module gives each of its files every block before the client opens it (``_preallocate``),
and a process that cannot have them keeps its observations out of the files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from app.domain.errors import ErrorCode
from app.storage.metrics_reads import MetricsSnapshot, read_snapshot

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Every file this module's metrics write: histograms and counters (a gauge would add its own).
_FILE_PREFIXES = ("histogram", "counter")
# prometheus-client's initial file size; the keys of this module's series take about a third
# of the histograms' file (tests/e2e/test_metrics_full_disk.py checks they fit), so
# a file never grows past the blocks given to it here.
FILE_BYTES = 1 << 16
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def _preallocate(directory: str, pid: int) -> str | None:
    """Give this process's metric files (named as prometheus-client names them) all their
    blocks; why not, when the file system cannot (None: done). The files it made are removed
    again then: an empty one would break every scrape's reading of the directory."""
    if not directory:  # only the client's old lower-case variable: not this service's way
        return f"{MULTIPROC_ENV} is not set"
    made: list[str] = []
    for prefix in _FILE_PREFIXES:
        name = os.path.join(directory, f"{prefix}_{pid}.db")
        try:
            try:
                fd = os.open(name, _OPEN | os.O_CREAT | os.O_EXCL, 0o600)
                made.append(name)
            except FileExistsError:  # a pid of this lifetime again: the client adds to it
                fd = os.open(name, _OPEN)
            try:
                # ENOSPC here, an error, rather than SIGBUS at a write through the mapping.
                os.posix_fallocate(fd, 0, FILE_BYTES)
            finally:
                os.close(fd)
        except OSError as exc:
            for path in made:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return f"{os.path.basename(name)}: {os.strerror(exc.errno or errno.EIO)}"
    return None


# Decided at import, before the first metric is made: whether this process's values go to
# files (the client picked its multiprocess class: the variable was set before it loaded),
# and if so whether their blocks could be had. A process without them keeps its values in
# memory and reports none of them: every api process answers the same sums, this one's
# observations left out until it restarts with room (a line at its start says so).
_IN_FILES = values.ValueClass is not values.MutexValue
FILES_PROBLEM: str | None = None
# No directory at all (``qinglong api`` could not make it, docs/metrics.md § A full disk):
# no process of this api has a file, so none reports any observation.
NO_DIRECTORY = False
if _IN_FILES:
    _DIRECTORY = os.environ.get(MULTIPROC_ENV, "")
    FILES_PROBLEM = _preallocate(_DIRECTORY, os.getpid())
    NO_DIRECTORY = bool(_DIRECTORY) and not os.path.isdir(_DIRECTORY)
    if FILES_PROBLEM is not None:
        values.ValueClass = values.MutexValue

_PROCESS = CollectorRegistry(auto_describe=True)
DISPATCH_PASS = Histogram(
    "qinglong_dispatch_pass_seconds",
    "Duration of one dispatch pass (one bounded page of queued runs, at most one launch).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=_PROCESS,
)
CREATED_TO_STARTED = Histogram(
    "qinglong_created_to_started_seconds",
    "From a run's creation to its attempt reaching running.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
    registry=_PROCESS,
)
# A fire is a few ms late; a slot caught up after downtime minutes to hours: one histogram,
# ``slot`` on_time | caught_up keeps the second from swamping the first's quantiles.
_FIRE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    15.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
)  # fmt: skip
FIRE_LATENESS = Histogram(
    "qinglong_schedule_fire_lateness_seconds",
    "From a schedule slot's due instant (the slot plus its jitter) to the commit of the "
    "transaction that decided it; slot=on_time when decided within the 5 s grace, else "
    "caught_up (a backlog after downtime or a resume).",
    labelnames=["slot"],
    buckets=_FIRE_BUCKETS,
    registry=_PROCESS,
)
SLOT_ON_TIME, SLOT_CAUGHT_UP = "on_time", "caught_up"
for _slot in (SLOT_ON_TIME, SLOT_CAUGHT_UP):
    FIRE_LATENESS.labels(slot=_slot)  # both series exist, at 0, before the first fire
# Counted by the api's 503 handler (app/api/problems.py): an outage seen from the requests it
# refused, by the api process that refused them. A scrape during the outage itself is
# refused too (the database figures), so alert on its increase once scrapes answer again.
DATABASE_UNAVAILABLE = Counter(
    "qinglong_api_database_unavailable",
    "Requests the api answered 503 because the database could not take them now, by code: "
    "STORAGE_UNAVAILABLE (cannot store writes), DATABASE_UNREACHABLE, DATABASE_BUSY.",
    labelnames=["code"],
    registry=_PROCESS,
)
UNAVAILABLE_CODES = (
    ErrorCode.STORAGE_UNAVAILABLE, ErrorCode.DATABASE_UNREACHABLE, ErrorCode.DATABASE_BUSY
)  # fmt: skip
for _code in UNAVAILABLE_CODES:
    DATABASE_UNAVAILABLE.labels(code=_code.value)  # every series at 0 before the first


def prepare_multiprocess_dir(path: Path) -> str | None:
    """Empty (or create, 0700) the directory the api processes keep their histograms in;
    why it could not be made (None: made).

    Called once by ``qinglong api`` before uvicorn starts its workers: files of an earlier
    service lifetime would otherwise be summed into this one's figures. A directory that
    cannot be made (a full disk: it needs an inode, and a block on most file systems) stops
    nothing: every api process then keeps its observations in memory and reports none, as
    one whose own file could not be had (docs/metrics.md § A full disk).
    """
    if path.is_symlink():
        raise RuntimeError(f"{path} is a symlink; refusing to use it for metrics")
    if path.exists():
        shutil.rmtree(path)
    try:
        path.mkdir(mode=0o700, parents=True)
    except OSError as exc:
        return os.strerror(exc.errno or errno.EIO)
    return None


class _Database(Collector):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        return _families(read_snapshot(self._engine))


def _families(snap: MetricsSnapshot) -> list[Metric]:
    runs = GaugeMetricFamily("qinglong_runs", "Runs by status.", labels=["status"])
    for status, n in sorted(snap.runs_by_status.items()):
        runs.add_metric([status], n)
    queue = GaugeMetricFamily("qinglong_queue_depth", "Runs queued, waiting for dispatch.")
    queue.add_metric([], snap.runs_by_status.get("queued", 0))
    ended = GaugeMetricFamily(
        "qinglong_runs_ended",
        "Ended runs by status and the error code of their last attempt ('' when none).",
        labels=["status", "error_code"],
    )
    for (status, code), n in sorted(snap.ended_by_code.items()):
        ended.add_metric([status, code], n)
    active = GaugeMetricFamily(
        "qinglong_attempts_active",
        "Attempts starting or running (each running attempt has one live shim).",
        labels=["status"],
    )
    for status, n in sorted(snap.attempts_active.items()):
        active.add_metric([status], n)
    journal = GaugeMetricFamily(
        "qinglong_journal_entries",
        "Receipt journal entries not yet consumed, by state: spawned counts live shims and "
        "receipts waiting for the worker; quarantined counts receipts set aside.",
        labels=["state"],
    )
    for state, n in sorted(snap.journal_by_state.items()):
        journal.add_metric([state], n)
    log_bytes = GaugeMetricFamily(
        "qinglong_log_bytes", "Bytes of job logs still there (expired ones not counted)."
    )
    log_bytes.add_metric([], snap.log_bytes)
    return [runs, queue, ended, active, journal, log_bytes]


def render(engine: Engine) -> bytes:
    """The exposition text: this service's observations, then the database's counts."""
    observed = _PROCESS
    path = os.environ.get(MULTIPROC_ENV)
    # Only when this process's own values were meant for files: a process that imported
    # prometheus-client before the variable was set (``qinglong api --workers 1`` serves in
    # the process that set it) keeps them in memory and must report those.
    if path and _IN_FILES:
        observed = CollectorRegistry()
        if os.path.isdir(path):  # else not made at the api's start: no process has a file
            MultiProcessCollector(observed, path=path)  # type: ignore[no-untyped-call]
    database = CollectorRegistry(auto_describe=False)
    database.register(_Database(engine))
    return generate_latest(observed) + generate_latest(database)
