"""The mapper's dead letters (``on_user_error="dead_letter"``): a batch whose ``map``
raised is bisected (:mod:`millstream.workers.bisection`) down to the rows that raise; those
are recorded as dead letters and the rest are mapped and go on into the window.

Exactly once, by construction: a dead letter is keyed by its partition and input row index
(:mod:`millstream.ledger.dead_letters`), and the write counts only the keys it does not find.
A mapper's output is not committed per batch (its persisted state is its input index,
persisted only once reducers committed the rows in its window), so a restarted mapper maps
the same batch again: it has the same boundaries (batch plans) and a deterministic ``map``
raises on the same rows, whose keys the replay rewrites without counting them again. The
records are written, in a transaction that checks the persisted state (split brain), before
the good rows enter the window: the persisted input index cannot pass a batch whose dead
letters are not in the store. If that write fails, nothing of the batch enters the window
and the batch is read and mapped again.

Keyed writes rather than the transaction that persists the input index past the batch:
that one comes a trim period later (when reducers have committed the batch's rows), so the
records would wait in memory meanwhile and the trim transaction, which every batch goes
through, would carry them; keyed, they land at once (``millstream status`` shows them while
the batch is in flight) and the happy path is untouched.
"""

from __future__ import annotations

import pyarrow as pa

from millstream.api import Partitioned
from millstream.exceptions import RetryableStoreError, StoreUnavailableError, UserCodeError
from millstream.ledger.dead_letters import DeadLetter
from millstream.state import StoreTransaction
from millstream.workers.bisection import split_off_failures
from millstream.workers.dead_letter_cap import record_within_cap
from millstream.workers.mapper_worker.instance import MapperInstance


class MapDeadLetters(MapperInstance):
    """Dead letters of ``map`` (a part of :class:`MapperWorker`)."""

    def map_around_dead_letters(
        self, batch: pa.RecordBatch, begin: int, error: Exception
    ) -> Partitioned | None:
        """The mapped rows of input rows ``[begin, begin + len(batch))`` but those ``map``
        raises on, which are recorded as dead letters first (None: every row raised).
        ``error``: what ``map`` raised on the whole batch.

        Raises:
            UserCodeError: ``map`` raises on rows together but on none alone.
            DeadLetterCapError: The dead letters pass the cap; nothing was recorded.
            SplitBrainError: Another instance wrote this mapper's state.
            RetryableStoreError, StoreUnavailableError: The store failed; nothing of the
                batch is recorded or pushed.
        """
        end = begin + batch.num_rows
        split = split_off_failures(
            batch,
            self._map_checked,
            error,
            passes=(RetryableStoreError, StoreUnavailableError),
            what=f"map of mapper {self.index} on input rows [{begin}, {end})",
        )
        letters = [
            DeadLetter("map", self.index, begin + at, 0, -1, repr(exc), batch.slice(at, 1))
            for at, exc in split.failures
        ]
        where = f"mapper {self.index}, input rows [{begin}, {end})"

        def record(txn: StoreTransaction) -> None:
            self._verify_persisted(txn)
            record_within_cap(txn, letters, self.tuning, end, where)

        self.store.transact(record, idempotent=True)
        self.dead_letters += len(letters)
        return split.result

    def _map_checked(self, rows: pa.RecordBatch) -> Partitioned:
        mapped = self.user.map(rows)
        if not isinstance(mapped, Partitioned):
            raise UserCodeError(
                f"map of mapper {self.index} returned {type(mapped).__name__}; it must "
                "return millstream.Partitioned"
            )
        return mapped
