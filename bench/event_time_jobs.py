"""The second stage of :mod:`bench.event_time`: panes' results from the queue into the store."""

from __future__ import annotations

import millstream as ms
import pyarrow as pa
import pyarrow.compute as pc
from millstream.state import decode_int64s


class ByPane(ms.Mapper):
    """Routes the first stage's rows by pane."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(
            batch.select(["window_start", "key", "n", "total"]),
            key="window_start",
            num_reducers=self.spec.num_reducers,
        )


def decode_result(value: bytes) -> tuple[int, int]:
    """The ``(n, total)`` of one stored value (two int64 lanes)."""
    n, total = decode_int64s(value, 2)
    return int(n), int(total)


class ResultsIntoStore(ms.Reducer):
    """Stores each ``(window_start, key)``'s ``(n, total)`` under ``("result", start, key)``.

    Each pane and key comes once (the queue is read exactly once), so the results are the
    counters the README's ``add_many`` with int columns keeps: two lanes per key, added to
    nothing. The store keeps such a batch compressed (a delta run) instead of upserting
    every key into its table.
    """

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch])
        for start in pc.unique(table["window_start"]).to_pylist():
            rows = table.filter(pc.equal(table["window_start"], start))
            txn.add_many(
                ("result", start), rows["key"].combine_chunks(), rows.select(["n", "total"])
            )
