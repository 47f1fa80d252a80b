"""Schedules' pure slot arithmetic: cron or interval to instants, DST, catch-up, jitter.

Pure (no I/O) but not standard library only: it parses cron with ``cronsim`` and reads zones
from ``zoneinfo`` with the ``tzdata`` package, which is why it is not part of app.domain
(docs/schedules-time.md).
"""
