"""The second stage of :mod:`bench.event_time`: panes' results from the queue into the store."""

from __future__ import annotations

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class ByPane(ms.Mapper):
    """Routes the first stage's rows by pane."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(
            batch.select(["window_start", "key", "n", "total"]),
            key="window_start",
            num_reducers=self.spec.num_reducers,
        )


def encode_results(n: pa.Array, total: pa.Array) -> pa.Array:
    """``(n, total)`` as one 16-byte little-endian value per row."""
    matrix = np.column_stack([np.asarray(n, np.int64), np.asarray(total, np.int64)])
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), len(matrix), [None, pa.py_buffer(np.ascontiguousarray(matrix).tobytes())]
    )
    return fixed.cast(pa.binary())


def decode_result(value: bytes) -> tuple[int, int]:
    """The ``(n, total)`` of one stored value."""
    n, total = np.frombuffer(value, dtype="<i8")
    return int(n), int(total)


class ResultsIntoStore(ms.Reducer):
    """Writes each ``(window_start, key)``'s ``(n, total)`` under ``("result", start, key)``."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch])
        for start in pc.unique(table["window_start"]).to_pylist():
            rows = table.filter(pc.equal(table["window_start"], start))
            values = encode_results(rows["n"].combine_chunks(), rows["total"].combine_chunks())
            txn.set_many(("result", start), rows["key"].combine_chunks(), values)
