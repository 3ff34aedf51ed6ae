"""The keyed sum's pre-aggregating mapper over :mod:`bench.kafka`'s topic, in a module of its
own: workers import a mapper's module, and this one needs nothing the fork server has not
imported (the benchmark's own module imports far more, which would cost each worker that
the first processor's fork server did not preload about half a second of CPU).
"""

from __future__ import annotations

import millstream as ms
import numpy as np
import pyarrow as pa

VALUE_BYTES = 80
"""A record's value: key and value as little-endian int64, then the 64-byte payload."""


class KafkaPreAggregate(ms.Mapper):
    """The example's pre-aggregating mapper over the topic's fixed-width values."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        keys, values = unpack(batch.column("value"))
        table = pa.table({"key": keys, "value": values})
        sums = table.group_by("key", use_threads=False).aggregate([("value", "sum")])
        sums = sums.rename_columns(["key", "value"])
        return ms.Partitioned.by_hash(sums, key="key", num_reducers=self.spec.num_reducers)


def unpack(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Key and value (int64) out of a binary column of 80-byte values, without a copy per
    row."""
    n = len(column)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[
        column.offset : column.offset + n + 1
    ]
    start, end = int(offsets[0]), int(offsets[-1])
    if end - start != n * VALUE_BYTES:
        raise ValueError(f"values are not all {VALUE_BYTES} bytes")
    rows = np.frombuffer(column.buffers()[2], dtype=np.uint8)[start:end].reshape(n, VALUE_BYTES)
    keys = np.ascontiguousarray(rows[:, 0:8]).view("<i8").ravel()
    values = np.ascontiguousarray(rows[:, 8:16]).view("<i8").ravel()
    return keys, values
