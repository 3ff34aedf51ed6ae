"""How many input rows a mapper reads per batch: ``Tuning.batch_rows``, fewer for wide rows.

Big batches let a pre-aggregating ``map`` combine most rows (its cost is per distinct key
of a batch), but a batch is held in memory twice over: as it was read, and mapped, in the
window. So a batch takes at most a quarter of the window's memory limit, in the bytes per
input row of the recent batches as read or as mapped, whichever is larger; the first batch,
before any row was seen, reads at most :data:`FIRST_BATCH_ROWS`. A stream's reads take what
has arrived, which is often less. Boundaries stay reproducible whatever the size: the first
instance to map a batch records them (:meth:`Ingestion.plan_batch`).
"""

from __future__ import annotations

import collections

FIRST_BATCH_ROWS = 65_536
"""Rows of a mapper instance's first read, before it knows how wide its rows are."""
WINDOW_SHARE = 4
"""A batch takes at most ``1 / WINDOW_SHARE`` of the window's memory limit."""


class BatchSize:
    """The rows of a mapper's next read, from the widths of its recent batches."""

    def __init__(self, batch_rows: int, memory_limit_bytes: int) -> None:
        self._batch_rows = batch_rows
        self._budget = memory_limit_bytes // WINDOW_SHARE
        self._bytes_per_row: collections.deque[float] = collections.deque(maxlen=8)

    def rows(self) -> int:
        """Rows to ask the reader for next (at least 1, at most ``batch_rows``)."""
        if not self._bytes_per_row:
            return min(self._batch_rows, FIRST_BATCH_ROWS)
        fit = int(self._budget / max(self._bytes_per_row))
        return max(1, min(self._batch_rows, fit))

    def saw(self, input_rows: int, read_bytes: int, mapped_bytes: int) -> None:
        """A batch of ``input_rows`` took ``read_bytes`` as read, ``mapped_bytes`` mapped."""
        if input_rows > 0:
            self._bytes_per_row.append(max(read_bytes, mapped_bytes, 1) / input_rows)
