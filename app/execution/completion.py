"""The completion service: the one path from a process ending to a terminal state.

docs/design.md §3.12. Used by the worker's live path (a shim
exited) and by recovery alike. Order matters and is what makes crashes replay safely:

* a receipt that is absent changes nothing (the reconciler decides about it later);
* a bad receipt (codec, ids, token, sequence) is first journaled ``quarantined`` (committed),
  then moved into quarantine; the run is untouched;
* a good receipt goes through the repository's single transaction, which also marks the
  journal entry ``consumed`` when it records the ending (``applied``) or proves it already
  recorded (``already_terminal``); only after that commit is the file removed. A crash
  before the commit replays: the transaction answers ``already_terminal`` and never appends
  a second terminal event. A crash after it leaves only the file, which retention removes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.domain.errors import ReceiptInvalid, VersionConflict
from app.domain.execution import CompletionOutcome
from app.domain.receipt import Receipt, decode_receipt
from app.execution.ports import AttemptCompletions, LogFactSource, ReceiptFiles, ReceiptJournal

log = logging.getLogger(__name__)

# fenced: this worker's lease epoch is superseded (docs/several-hosts.md §4): nothing was
# written, the receipt and its journal entry stay for the worker that holds the lease now.
ConsumeStatus = Literal["absent", "applied", "already_terminal", "quarantined", "fenced"]
_CAS_RETRIES = 3  # a concurrent cancel intent may bump the run version between read and CAS


@dataclass(frozen=True, slots=True)
class ConsumeResult:
    """What one consumption did. ``reason`` is a stable code, never receipt content."""

    status: ConsumeStatus
    run_status: str | None = None
    reason: str | None = None
    task: str | None = None  # the run's task when applied


class CompletionService:
    """Consumes an attempt's receipt exactly once into its terminal state."""

    def __init__(
        self,
        *,
        receipts: ReceiptFiles,
        journal: ReceiptJournal,
        completions: AttemptCompletions,
        log_facts: LogFactSource,
        fence: Callable[[], tuple[str, int]] | None = None,
    ) -> None:
        # The lease (slot, epoch) this worker holds now; every completion carries it.
        self._fence = fence
        self._receipts = receipts
        self._journal = journal
        self._completions = completions
        self._log_facts = log_facts

    def consume(self, *, run_id: str, attempt_id: str) -> ConsumeResult:
        """Feed the attempt's receipt, if any, to the completion transaction."""
        try:
            raw = self._receipts.read(attempt_id)
            if raw is None:
                return ConsumeResult("absent")
            receipt = decode_receipt(raw)
        except ReceiptInvalid as exc:
            return self._quarantine(attempt_id, exc.reason)
        if receipt.attempt_id != attempt_id or receipt.run_id != run_id:
            return self._quarantine(attempt_id, "WRONG_IDS")
        outcome = self._complete(receipt)
        if outcome.status == "fenced":
            return ConsumeResult("fenced", reason=outcome.reason)
        if outcome.status == "rejected":
            return self._quarantine(attempt_id, outcome.reason or "REJECTED")
        # Committed with the journal's consumed mark: only now may the receipt go (§2.5).
        self._receipts.remove(attempt_id)
        return ConsumeResult(
            "applied" if outcome.status == "applied" else "already_terminal",
            run_status=outcome.run_status,
            task=outcome.task,
        )

    def _complete(self, receipt: Receipt) -> CompletionOutcome:
        log_info = self._log_facts.log_info(receipt.attempt_id)
        # Only a worker with a lease carries a fence (a test double may not take one).
        fenced = {} if self._fence is None else {"fence": self._fence()}
        for attempt in range(_CAS_RETRIES):
            try:
                return self._completions.complete_attempt(
                    run_id=receipt.run_id,
                    attempt_id=receipt.attempt_id,
                    token=receipt.token,
                    callback_sequence=receipt.callback_sequence,
                    exit_code=receipt.exit_code,
                    signal=receipt.signal,
                    finished_at_ms=receipt.finished_at_ms,
                    log=log_info,
                    started_at_ms=receipt.started_at_ms,
                    consume_receipt=True,
                    leftovers_stopped=receipt.leftovers_stopped,
                    **fenced,
                )
            except VersionConflict:
                if attempt == _CAS_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _quarantine(self, attempt_id: str, reason: str) -> ConsumeResult:
        # Journal first (committed), then the file: a crash in between replays to the same
        # decision, and the file is never lost without a durable record of why.
        self._journal.mark_quarantined(attempt_id=attempt_id, reason=reason)
        moved = self._receipts.quarantine(attempt_id)
        if not moved:
            log.warning(
                "receipt of attempt %s quarantined, but its file could not be moved (reason %s)",
                attempt_id, reason,
            )  # fmt: skip
        else:  # a receipt that was not the job's own: worth an operator's eye (codes only)
            log.warning("receipt of attempt %s quarantined (reason %s)", attempt_id, reason)
        return ConsumeResult("quarantined", reason=reason)
