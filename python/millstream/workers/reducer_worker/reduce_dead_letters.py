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

import pyarrow as pa

from millstream.api import Transaction
from millstream.exceptions import (
    RetryableStoreError,
    StoreUnavailableError,
    TransactionTooLargeError,
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


class ReduceDeadLetters(ReducerCommit):
    """Dead letters of ``reduce`` (a part of :class:`ReducerWorker`)."""

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
            self._reduce_apart,
            error,
            passes=(RetryableStoreError, StoreUnavailableError, TransactionTooLargeError),
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

    def _reduce_apart(self, rows: pa.RecordBatch) -> None:
        """``reduce`` on ``rows`` in a transaction that is reset: a bisection step."""
        txn = ReplayingTransaction(self.store)
        try:
            with self.time_spent.spent_on("reduce"):
                self.user.reduce(rows, Transaction(txn, self._staged_outputs()))
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
