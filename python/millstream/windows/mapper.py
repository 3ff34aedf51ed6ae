"""The windowed aggregation's mapper: rows to partials per window and key, plus watermarks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from millstream.api import Mapper, Partitioned
from millstream.windows.partials import START, Plan, combine
from millstream.windows.spec import UsesWindows

MAPPER = "_mapper"
"""Column naming the mapper of a watermark row (null on partial rows)."""

WATERMARK = "_watermark"
"""Column holding a watermark row's event time (null on partial rows); its type is the
time column's, which tells reducers the time unit."""


class WindowMapper(Mapper, UsesWindows):
    """Assigns each row to its windows and combines the batch into partial aggregates per
    ``(window, key)`` before the shuffle (routed by key), then adds one watermark row per
    reducer: the latest event time of the batch, from this mapper.

    Configure with ``config={"windows": ms.windows.Windows(...)}``. To derive columns
    first (parse, filter), subclass it and override :meth:`prepare`. Everything here is
    deterministic, as ``map`` must be.
    """

    def prepare(self, batch: pa.RecordBatch) -> pa.Table:
        """The rows to aggregate; by default the input batch as it is."""
        return pa.Table.from_batches([batch])

    def map(self, batch: pa.RecordBatch) -> Partitioned:
        windows = self.windows
        plan = Plan.of(windows)
        table = self.prepare(batch)
        partials, latest, kind = combine(table, windows, plan)
        reducers = self.spec.num_reducers
        shuffled = Partitioned.by_hash(
            partials, key=plan.key, num_reducers=reducers, key_groups=self.spec.key_groups
        )
        rows = pa.Table.from_batches([shuffled.batch])
        rows = rows.append_column(MAPPER, pa.nulls(rows.num_rows, pa.int32()))
        rows = rows.append_column(WATERMARK, pa.nulls(rows.num_rows, kind))
        if table.num_rows == 0:
            return Partitioned.with_indices(rows, shuffled.reducer_indices)
        marks = {
            field.name: pa.nulls(reducers, field.type)
            for field in rows.schema
            if field.name not in (MAPPER, WATERMARK)
        }
        marks[MAPPER] = pa.array([self.spec.index] * reducers, pa.int32())
        marks[WATERMARK] = pa.array([latest] * reducers, pa.int64()).cast(kind)
        watermarks = pa.table(marks, schema=rows.schema)
        indices = pa.concat_arrays(
            [shuffled.reducer_indices, pa.array(np.arange(reducers, dtype=np.int32))]
        )
        return Partitioned.with_indices(pa.concat_tables([rows, watermarks]), indices)


__all__ = ["MAPPER", "START", "WATERMARK", "WindowMapper"]
