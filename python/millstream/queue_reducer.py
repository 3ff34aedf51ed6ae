"""The persistent-queue reducer (thesis section 6): rows stay pending across commits.

A :class:`~millstream.Reducer` sees each batch once, inside the transaction that commits
it. A :class:`QueueReducer` sees, every round, every row it has fetched and not finished
yet (its :class:`PendingRows`), and finishes the rows it is done with in that round's
transaction. Rows it has not finished stay in the mappers' windows (memory, never the
store) and come again in the next round, and after any failure; rows it finished and
committed never come again. Event-time aggregation is its use: a pane's rows wait, pending,
until the watermark closes it, and only the pane's result is written.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from millstream.api import Reducer, Transaction
from millstream.exceptions import ConfigurationError


class PendingRows:
    """The rows a :class:`QueueReducer` has fetched and not finished, for one round.

    Attributes:
        rows: Every pending row, each input partition's rows in the order its mapper
            produced them, partition after partition.
        partitions: The input partition each row came from (int32, one per row).
        ended_partitions: Partitions whose input ended and whose every row for this reducer is
            in ``rows`` or finished: nothing more will come from them. When it holds all
            ``spec.num_partitions``, finish every row (the processor drains once all are
            finished). After a
            round too large for one transaction, ``rows`` holds only the first part of each
            partition's pending rows (halved until a round commits, then doubled back), and a
            partition whose rows are cut is not in it.
        fetched_rows: How many of ``rows`` arrived in this round (the others were pending
            already; after a restart every row counts as arrived).
        runs: ``(partition, first row, end)`` of each partition's rows in ``rows``.
    """

    def __init__(
        self,
        rows: pa.Table,
        partitions: np.ndarray,
        ended_partitions: frozenset[int],
        fetched_rows: int,
    ) -> None:
        self.rows = rows
        self.partitions = pa.array(partitions, pa.int32())
        self.ended_partitions = ended_partitions
        self.fetched_rows = fetched_rows
        self._finished = np.zeros(rows.num_rows, dtype=bool)
        starts = np.flatnonzero(np.diff(partitions, prepend=-1) != 0)
        ends = [*starts[1:], len(partitions)]
        self.runs = [
            (int(partitions[a]), int(a), int(b)) for a, b in zip(starts, ends, strict=True)
        ]

    @property
    def mapper_indices(self) -> pa.Int32Array:
        """Deprecated name of :attr:`partitions`."""
        warnings.warn(
            "PendingRows.mapper_indices is deprecated: use PendingRows.partitions",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.partitions

    @property
    def ended_mappers(self) -> frozenset[int]:
        """Deprecated name of :attr:`ended_partitions`."""
        warnings.warn(
            "PendingRows.ended_mappers is deprecated: use PendingRows.ended_partitions",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.ended_partitions

    def __len__(self) -> int:
        return int(self.rows.num_rows)

    def finish(
        self, rows: pa.Array | pa.ChunkedArray | np.ndarray | Sequence[bool]
    ) -> pa.BooleanArray:
        """Mark rows finished (a boolean mask over :attr:`rows`; calls add up), and return
        the mask of the rows this round's commit finishes.

        A reducer's progress is one position per input partition, so the commit finishes,
        per partition, the longest run of marked rows from that partition's first pending
        row on: a marked row behind an unmarked one of the same partition stays pending and
        comes again. Write
        effects only for the rows of the returned mask, or keep what tells you a row is
        covered (such as the end of the last window emitted) in the transaction, so that
        seeing it again changes nothing.

        Raises:
            ValueError: The mask's length is not the number of pending rows, or it has nulls.
        """
        if isinstance(rows, pa.ChunkedArray):
            rows = rows.combine_chunks()
        if isinstance(rows, pa.Array):
            if rows.null_count:
                raise ValueError("the finish mask has nulls; give True or False for every row")
            mask = rows.to_numpy(zero_copy_only=False).astype(bool, copy=False)
        else:
            mask = np.asarray(rows, dtype=bool)
        if mask.shape != self._finished.shape:
            raise ValueError(
                f"the finish mask has {mask.size} values for {self._finished.size} pending "
                "rows; give one per row of PendingRows.rows"
            )
        self._finished |= mask
        return self.finished()

    def finish_all(self) -> None:
        """Mark every pending row finished."""
        self._finished[:] = True

    def finished(self) -> pa.BooleanArray:
        """The rows this round's commit finishes, as things stand (see :meth:`finish`)."""
        out = np.zeros(len(self._finished), dtype=bool)
        prefix = self.finished_prefix()
        for m, start, _ in self.runs:
            out[start : start + prefix[m]] = True
        return pa.array(out, pa.bool_())

    def finished_prefix(self) -> dict[int, int]:
        """Per partition with pending rows, how many of its first rows the commit finishes."""
        out: dict[int, int] = {}
        for m, a, b in self.runs:
            unfinished = np.flatnonzero(~self._finished[a:b])
            out[m] = int(unfinished[0]) if unfinished.size else b - a
        return out


class QueueReducer(Reducer):
    """Base class of a reducer that keeps rows pending across commits (a persistent queue).

    Every round, :meth:`process` gets every row fetched and not finished yet, and finishes
    some through :meth:`PendingRows.finish`; what it writes through ``txn`` commits together
    with the finished rows, or not at all. Rows not finished come again next round, and
    after any failure; finished rows never do. Keep no state in memory that the rows and
    the store do not give back: a round may fail to commit and be repeated.

    The pending rows stay in the mappers' windows until finished, so they must fit their
    memory (:attr:`~millstream.Tuning.memory_limit_bytes`): finish rows as soon as you can,
    and pre-aggregate in ``map``. A mapper whose window is full reads no more input until
    rows are finished. Exactly-once delivery only.

    A round whose ``process`` finishes nothing and writes nothing commits nothing.
    """

    @abstractmethod
    def process(self, pending: PendingRows, txn: Transaction) -> None:
        """Look at the pending rows, write what is done through ``txn``, and finish the
        rows it covers."""

    def hand_over(self, pending: PendingRows, txn: Transaction) -> None:
        """Called instead of :meth:`process` during a rescale (:func:`millstream.rescale`)
        once every row up to where the old reducers stop is pending here or finished (their
        run's inputs end there, and :attr:`PendingRows.ended_partitions` is hidden from
        :meth:`process` until then): store through ``txn`` what the pending rows stand for,
        addressed by key group so that each key group's new owner finds it (see
        :class:`~millstream.event_time.PendingPaneReducer`), and finish every row; the
        reducer's :meth:`~millstream.Reducer.on_rescale` hands over what it keeps under its
        index. Not overriding it makes the reducer refuse rescales.

        Raises:
            ConfigurationError: The reducer does not override it.
        """
        raise ConfigurationError(
            f"{type(self).__name__} cannot be rescaled: it keeps rows pending and does not "
            "override QueueReducer.hand_over, which stores them for their new owners"
        )

    @classmethod
    def can_hand_over(cls) -> bool:
        """Whether the reducer overrides :meth:`hand_over` (and so can be rescaled)."""
        return cls.hand_over is not QueueReducer.hand_over

    def reduce(self, batch: pa.RecordBatch, txn: Transaction) -> None:
        """Not used: a queue reducer's rows go to :meth:`process`."""
        raise TypeError(f"{type(self).__name__} is a QueueReducer: millstream calls process")


__all__ = ["PendingRows", "QueueReducer"]
