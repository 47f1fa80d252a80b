"""What a due slot does when runs of its schedule have not ended (docs/schedules.md §5).

Pure: the storage layer reads the schedule's non-terminal runs inside the fire transaction,
asks ``decide_overlap``, and writes the answer in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

OverlapKind = Literal["fired", "queued", "replaced", "skipped_overlap"]


@dataclass(frozen=True, slots=True)
class ActiveRun:
    """One run of the schedule that has not ended, oldest first (by slot)."""

    id: str
    slot_ms: int
    status: str  # queued | dispatching | running
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class OverlapDecision:
    """The slot's decision; what to create and cancel for it."""

    kind: OverlapKind
    # skipped_overlap: the run that blocked the slot (the oldest not ended).
    blocking_run: str | None = None
    # A new run is created (fired, queued, replaced).
    creates: bool = False
    # The new run is not dispatched while a run of the schedule with a slot in
    # [hold_from_slot_ms, its own slot) has not ended (None: dispatched as usual).
    hold_from_slot_ms: int | None = None
    # Runs that get a cancel intent with reason ``replaced`` (a queued one ends at once).
    cancel: tuple[str, ...] = ()


def decide_overlap(
    policy: str, max_concurrent: int, active: Sequence[ActiveRun]
) -> OverlapDecision:
    """The decision for one due slot given the schedule's runs that have not ended.

    - ``skip``: fire when none is active, else ``skipped_overlap``.
    - ``allow``: fire while fewer than ``max_concurrent`` are active.
    - ``queue_one``: fire when none is active; with one active the new run waits
      (``queued``, held until every older run of the schedule ended); with two (one runs,
      one waits) ``skipped_overlap``.
    - ``replace``: fire when none is active; else every active run without a cancel intent
      gets one (reason ``replaced``; a queued one, never started, ends at once, so a newer
      slot replaces a replacement still waiting) and the new run is held until they ended.
    """
    if not active:
        return OverlapDecision("fired", creates=True)
    oldest = active[0]
    if policy == "allow":
        if len(active) < max_concurrent:
            return OverlapDecision("fired", creates=True)
        return OverlapDecision("skipped_overlap", blocking_run=oldest.id)
    if policy == "queue_one":
        if len(active) == 1:
            return OverlapDecision("queued", creates=True, hold_from_slot_ms=oldest.slot_ms)
        return OverlapDecision("skipped_overlap", blocking_run=oldest.id)
    if policy == "replace":
        cancel = tuple(r.id for r in active if not r.cancel_requested)
        # A queued one cancelled here ends in this transaction: the hold covers the others.
        staying = [r for r in active if not (r.status == "queued" and r.id in cancel)]
        hold = staying[0].slot_ms if staying else None
        return OverlapDecision("replaced", creates=True, hold_from_slot_ms=hold, cancel=cancel)
    return OverlapDecision("skipped_overlap", blocking_run=oldest.id)  # skip (the default)
