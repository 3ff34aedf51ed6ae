"""The event-time aggregation's mapper: rows combined into partials per pane and key, plus
one watermark row per reducer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from millstream.api import Mapper, Partitioned
from millstream.event_time.aggregation import UsesPanes
from millstream.event_time.partials import START, Plan, combine

PARTITION = "_mapper"
"""Column naming the input partition of a watermark row (null on partial rows). Its name
is the one earlier releases gave it: rows a straggler spill wrote carry it."""

WATERMARK = "_watermark"
"""Column holding a watermark row's event time (null on partial rows); its type is the
time column's, which tells reducers the time unit."""


class PaneMapper(Mapper, UsesPanes):
    """Assigns each row to its panes and combines the batch into partial aggregates per
    ``(pane, key)`` before the shuffle (routed by key), then adds one watermark row per
    reducer: the latest event time of the batch, from this mapper's input partition.

    Configure with ``config={"panes": ms.event_time.Panes(...)}``. To derive columns
    first (parse, filter), subclass it and override :meth:`prepare`. Everything here is
    deterministic, as ``map`` must be.
    """

    def prepare(self, batch: pa.RecordBatch) -> pa.Table:
        """The rows to aggregate; by default the input batch as it is."""
        return pa.Table.from_batches([batch])

    def map(self, batch: pa.RecordBatch) -> Partitioned:
        panes = self.panes
        plan = Plan.of(panes)
        table = self.prepare(batch)
        partials, latest, kind = combine(table, panes, plan)
        reducers = self.spec.num_reducers
        shuffled = Partitioned.by_hash(
            partials, key=plan.key, num_reducers=reducers, key_groups=self.spec.key_groups
        )
        rows = pa.Table.from_batches([shuffled.batch])
        rows = rows.append_column(PARTITION, pa.nulls(rows.num_rows, pa.int32()))
        rows = rows.append_column(WATERMARK, pa.nulls(rows.num_rows, kind))
        if table.num_rows == 0:
            return Partitioned.with_indices(rows, shuffled.reducer_indices)
        marks = {
            field.name: pa.nulls(reducers, field.type)
            for field in rows.schema
            if field.name not in (PARTITION, WATERMARK)
        }
        marks[PARTITION] = pa.array([self.spec.index] * reducers, pa.int32())
        marks[WATERMARK] = pa.array([latest] * reducers, pa.int64()).cast(kind)
        watermarks = pa.table(marks, schema=rows.schema)
        indices = pa.concat_arrays(
            [shuffled.reducer_indices, pa.array(np.arange(reducers, dtype=np.int32))]
        )
        return Partitioned.with_indices(pa.concat_tables([rows, watermarks]), indices)


__all__ = ["PARTITION", "START", "WATERMARK", "PaneMapper"]
