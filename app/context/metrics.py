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
"""

from __future__ import annotations

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


def prepare_multiprocess_dir(path: Path) -> None:
    """Empty (or create, 0700) the directory the api processes keep their histograms in.

    Called once by ``qinglong api`` before uvicorn starts its workers: files of an earlier
    service lifetime would otherwise be summed into this one's figures.
    """
    if path.is_symlink():
        raise RuntimeError(f"{path} is a symlink; refusing to use it for metrics")
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700, parents=True)


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
    # Only when this process's own values went to files: a process that imported
    # prometheus-client before the variable was set (``qinglong api --workers 1`` serves in
    # the process that set it) keeps them in memory and must report those.
    if path and values.ValueClass is not values.MutexValue:
        observed = CollectorRegistry()
        MultiProcessCollector(observed, path=path)  # type: ignore[no-untyped-call]
    database = CollectorRegistry(auto_describe=False)
    database.register(_Database(engine))
    return generate_latest(observed) + generate_latest(database)
