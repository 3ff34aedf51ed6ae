"""The reducer's dead letters (``on_user_error="dead_letter"``): a round whose ``reduce``
raised is bisected (:mod:`millstream.workers.bisection`) down to the rows that raise, and
committed again with the other rows' effects and those rows' dead letters in one
transaction.

Each bisection step runs ``reduce`` in a transaction of its own that is reset afterwards
(its writes and staged outputs dropped), so only the final commit writes anything: the
good rows' effects, the dead letters (:mod:`millstream.ledger.dead_letters`), the new
committed indices and the counters land together or not at all. A crash before that commit
leaves the rows uncommitted in the mappers' windows; the next instance fetches them again
and finds the same dead rows (a deterministic ``reduce`` on the same rows). A failed
commit (the store, a conflict) drops the records with the rest: a later round writes them.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from millstream.api import Transaction
from millstream.exceptions import (
    DeadLetterCapError,
    RetryableStoreError,
    StoreUnavailableError,
    TransactionTooLargeError,
    UserCodeError,
)
from millstream.ledger import reduced_key
from millstream.ledger.dead_letters import DeadLetter
from millstream.state import StoreTransaction, decode_int64
from millstream.state.replay import ReplayingTransaction
from millstream.workers.bisection import split_off_failures
from millstream.workers.dead_letter_cap import record_within_cap
from millstream.workers.reducer_worker.commit import ReducerCommit

Origin = tuple[int, int, int]
"""Where a stretch of a round's rows came from: ``(partition, first shuffle index of the
fetch, rows)``, in the round's order."""

STORE_ERRORS = (RetryableStoreError, StoreUnavailableError, TransactionTooLargeError)
"""Errors of a reducer's bisection step that are the store's, not the rows': raised as
they come."""


class ReduceDeadLetters(ReducerCommit):
    """Dead letters of ``reduce`` (a part of :class:`ReducerWorker`)."""

    store_errors = STORE_ERRORS

    def bisectable(self, exc: UserCodeError, bisected: bool) -> BaseException | None:
        """What the user's code raised in a round's commit ``exc``, if the round's rows
        are to be bisected for it (None: the error stops the run): with
        ``on_user_error="dead_letter"``, once per round (``bisected``: done already),
        never for the cap."""
        if (
            self.tuning.on_user_error != "dead_letter"
            or bisected
            or isinstance(exc, DeadLetterCapError)
        ):
            return None
        return exc.__cause__

    def split_off_dead_letters(
        self, batch: pa.RecordBatch, origins: list[Origin], error: BaseException, what: str
    ) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """The rows of ``batch`` that ``reduce`` runs on, and dead letters of the others.
        ``error``: what ``reduce`` raised on the whole batch.

        Raises:
            UserCodeError: ``reduce`` raises on rows together but on none alone.
            RetryableStoreError, StoreUnavailableError: The store failed in a step.
        """
        split = split_off_failures(
            batch,
            lambda rows: self.run_apart(lambda txn: self.user.reduce(rows, txn)),
            error,
            passes=STORE_ERRORS,
            what=what,
        )
        letters = []
        starts = [0]
        for _, _, rows in origins:
            starts.append(starts[-1] + rows)
        stretch = 0
        for at, exc in split.failures:
            while at >= starts[stretch + 1]:
                stretch += 1
            partition, first, _ = origins[stretch]
            letters.append(
                DeadLetter(
                    "reduce",
                    partition,
                    first,
                    at - starts[stretch],
                    self.index,
                    repr(exc),
                    batch.slice(at, 1),
                )
            )
        return split.kept, letters

    def run_apart(self, code: Callable[[Transaction], object]) -> None:
        """The user's ``code`` in a transaction that is reset (its writes and staged
        outputs dropped): a bisection step."""
        txn = ReplayingTransaction(self.store)
        try:
            with self.time_spent.spent_on("reduce"):
                code(Transaction(txn, self._staged_outputs()))
        finally:
            txn.reset()

    def record_reduce_dead_letters(
        self, txn: StoreTransaction, letters: list[DeadLetter], rows: int
    ) -> None:
        """Write ``letters`` in the round's commit ``txn`` (``rows``: the round's rows).

        Raises:
            DeadLetterCapError: They pass the cap.
        """
        raw = txn.get(reduced_key(self.index, "rows"), snapshot=True)
        before = 0 if raw is None else decode_int64(raw)
        where = f"reducer {self.index}, a round of {rows} rows"
        record_within_cap(txn, letters, self.tuning, before + rows, where)
