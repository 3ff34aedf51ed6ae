"""A queue reducer's dead letters (``on_user_error="dead_letter"``): a round whose
``process`` raised is bisected (:mod:`millstream.workers.bisection`) down to the pending
rows it raises on; those rows are set aside, ``process`` goes on over the others, and each
set-aside row's dead letter is written in the commit that finishes it.

A pending row is finished, as every other, per partition from the first pending row on:
a set-aside row counts as finished, so the commit that finishes the rows before it
finishes it too, and writes its dead letter (keyed by its partition and shuffle index,
:class:`~millstream.ledger.dead_letters.DeadLetter`) with the other rows' effects and the
new committed indices, or nothing of them. Until then the row stays pending in the
mappers' windows; this instance remembers it (not bisecting again each round), and an
instance that restarts finds it again (a deterministic ``process`` on the same rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from millstream.api import Transaction
from millstream.ledger.dead_letters import DeadLetter
from millstream.queue_reducer import PendingRows
from millstream.workers.bisection import split_off_failures
from millstream.workers.reducer_worker.pending_queue import PendingQueue

if TYPE_CHECKING:
    from millstream.workers.reducer_worker.reduce_dead_letters import ReduceDeadLetters

Step = Callable[[PendingRows, Transaction], None]
"""The user's ``process`` (or ``hand_over``)."""


def _subset(pending: PendingRows, positions: np.ndarray) -> PendingRows:
    """The pending rows at ``positions`` (in order), as ``process`` sees them."""
    take = pa.array(positions, pa.int64())
    partitions = pending.partitions.to_numpy(zero_copy_only=False)[positions]
    return PendingRows(
        pending.rows.take(take), partitions, pending.ended_partitions, pending.fetched_rows
    )


class PendingDeadLetters:
    """The pending rows a queue reducer's ``process`` raised on: found, set aside from
    ``process``, and made dead letters in the commit that finishes them."""

    def __init__(self) -> None:
        self._errors: dict[tuple[int, int], str] = {}
        """(partition, shuffle index): what ``process`` raised on the row alone."""

    def set_aside(self, queue: PendingQueue, pending: PendingRows) -> np.ndarray:
        """Positions in ``pending`` (the last view of ``queue``) of rows found to raise."""
        if not self._errors:
            return np.zeros(0, np.int64)
        keys = zip(
            pending.partitions.to_numpy(zero_copy_only=False).tolist(),
            queue.viewed_indices().tolist(),
            strict=True,
        )
        return np.array([at for at, key in enumerate(keys) if key in self._errors], np.int64)

    def without(
        self, pending: PendingRows, aside: np.ndarray
    ) -> tuple[PendingRows, PendingRows, np.ndarray]:
        """For one attempt at committing: ``pending`` with nothing finished yet, the rows
        of it ``process`` sees (all but those ``aside``), and their positions. ``pending``
        itself when none is aside."""
        everything = np.arange(len(pending))
        if not aside.size:
            return pending, pending, everything
        kept = np.setdiff1d(everything, aside)
        return _subset(pending, everything), _subset(pending, kept), kept

    def finish_aside(
        self, pending: PendingRows, seen: PendingRows, kept: np.ndarray, aside: np.ndarray
    ) -> None:
        """Carry what ``process`` finished of ``seen`` (the rows of ``pending`` at ``kept``)
        into ``pending``, the rows ``aside`` finished with them."""
        if not aside.size:
            return
        mask = np.ones(len(pending), dtype=bool)
        mask[kept] = seen.finished().to_numpy(zero_copy_only=False)
        pending.finish(mask)

    def letters(
        self, queue: PendingQueue, pending: PendingRows, aside: np.ndarray, reducer: int
    ) -> list[DeadLetter]:
        """Dead letters of the rows ``aside`` that the commit finishes (a partition's
        prefix of finished rows holds them)."""
        if not aside.size:
            return []
        prefix = pending.finished_prefix()
        starts = {m: start for m, start, _ in pending.runs}
        indices = queue.viewed_indices()
        partitions = pending.partitions.to_numpy(zero_copy_only=False)
        out = []
        for at in aside.tolist():
            m = int(partitions[at])
            if at - starts[m] >= prefix.get(m, 0):
                continue
            shuffle_index = int(indices[at])
            out.append(
                DeadLetter(
                    "reduce",
                    m,
                    shuffle_index,
                    0,
                    reducer,
                    self._errors[(m, shuffle_index)],
                    pending.rows.slice(at, 1).combine_chunks().to_batches()[0],
                )
            )
        return out

    def bisect(
        self,
        worker: ReduceDeadLetters,
        queue: PendingQueue,
        pending: PendingRows,
        aside: np.ndarray,
        step: Step,
        error: BaseException,
        what: str,
    ) -> None:
        """Find the rows of ``pending`` not ``aside`` that ``step`` raises on alone
        (``error``: what it raised on them together), and set them aside.

        Raises:
            UserCodeError: ``step`` raises on rows together but on none alone.
            RetryableStoreError, StoreUnavailableError: The store failed in a step.
        """
        kept = np.setdiff1d(np.arange(len(pending)), aside)
        split = split_off_failures(
            pa.record_batch({"position": pa.array(kept, pa.int64())}),
            lambda rows: worker.run_apart(
                lambda txn: step(_subset(pending, rows["position"].to_numpy()), txn)
            ),
            error,
            passes=worker.store_errors,
            what=what,
        )
        indices = queue.viewed_indices()
        partitions = pending.partitions.to_numpy(zero_copy_only=False)
        for at, exc in split.failures:
            position = int(kept[at])
            key = (int(partitions[position]), int(indices[position]))
            self._errors[key] = repr(exc)

    def forget(self, committed: tuple[int, ...]) -> None:
        """Drop the rows at or below the committed indices (their letters are written)."""
        self._errors = {
            (m, index): error for (m, index), error in self._errors.items() if index > committed[m]
        }


__all__ = ["PendingDeadLetters"]
