"""The receipt journal's states: one spelling for the storage adapter and for execution.

What each state means and how entries move between them: app/storage/journal_repo.py.
"""

from __future__ import annotations

RESERVED = "reserved"
SPAWNED = "spawned"
SPAWN_FAILED = "spawn_failed"
CONSUMED = "consumed"
QUARANTINED = "quarantined"
FENCED = "fenced"
STATES = frozenset({RESERVED, SPAWNED, SPAWN_FAILED, CONSUMED, QUARANTINED, FENCED})
