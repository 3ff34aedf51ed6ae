"""A job with poison rows for the dead-letter tests: a pass-through ``map`` that raises on
some rows and a summing ``reduce`` that raises on others, and what it must commit.

Rows are ``(key, value)`` with every ``value`` unique (``write_keyed_input(...,
unique_values=True)``, or :func:`poisoned_tables`): ``value % POISON_EVERY`` picks the rows
that poison ``map`` (:data:`MAP_POISON`) and those that poison ``reduce``
(:data:`REDUCE_POISON`).
"""

from __future__ import annotations

import time
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

POISON_EVERY = 200
MAP_POISON = 17
REDUCE_POISON = 117
"""With :data:`POISON_EVERY`: one row in 100 is poison, half for each stage."""


def _poison(values: pa.Array, residue: int) -> pa.Array:
    return pc.equal(pc.remainder(values, POISON_EVERY), residue)


class PoisonedPassThrough(ms.Mapper):
    """Routes rows by ``key``; raises on a batch holding a map-poison row."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        poison = batch["value"].filter(_poison(batch["value"], MAP_POISON))
        if len(poison):
            raise ValueError(f"map cannot take value {poison[0].as_py()}")
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class SlowPoisonedPassThrough(PoisonedPassThrough):
    """:class:`PoisonedPassThrough` that sleeps ``config["map_seconds"]`` per 2,000 rows
    (bisection's calls on parts of a batch sleep their part): a run long enough to be
    killed at every stage."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        time.sleep(float(self.config.get("map_seconds", 0.0)) * batch.num_rows / 2_000)
        return super().map(batch)


class PoisonedSum(ms.Reducer):
    """Adds ``value`` per ``key`` under ``("sum", key)``; raises on a batch holding a
    reduce-poison row (after writing the others' sums: bisection must drop those writes)."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        sums = pa.Table.from_batches([batch]).group_by("key").aggregate([("value", "sum")])
        txn.add_many(("sum",), sums["key"].combine_chunks(), sums["value_sum"].combine_chunks())
        poison = batch["value"].filter(_poison(batch["value"], REDUCE_POISON))
        if len(poison):
            raise ValueError(f"reduce cannot take value {poison[0].as_py()}")


def poisoned_tables(partitions: int, rows: int, keys: int = 50) -> list[pa.Table]:
    """``rows`` rows per partition, values unique over all of them."""
    return [
        pa.table(
            {
                "key": pa.array(np.arange(rows) % keys + p, pa.int64()),
                "value": pa.array(np.arange(p * rows, (p + 1) * rows), pa.int64()),
            }
        )
        for p in range(partitions)
    ]


def good_sums(table: pa.Table) -> dict[Any, int]:
    """Sums of ``value`` per ``key`` over the rows neither stage raises on."""
    values = table["value"]
    good = pc.invert(pc.or_(_poison(values, MAP_POISON), _poison(values, REDUCE_POISON)))
    sums = table.filter(good).group_by("key").aggregate([("value", "sum")])
    return dict(zip(sums["key"].to_pylist(), sums["value_sum"].to_pylist(), strict=True))


def poison_values(table: pa.Table, residue: int) -> list[int]:
    """The values of the rows that poison a stage, in order."""
    values = table["value"]
    return sorted(values.filter(_poison(values, residue)).to_pylist())


class PoisonedQueueSum(ms.QueueReducer):
    """:class:`PoisonedSum` as a queue reducer: gathers pending rows until it holds
    ``config["gather_rows"]`` (default 500) or every input ended, then adds their values
    per ``key`` and finishes them all; raises on any round whose pending rows hold a
    reduce-poison row (after writing the others' sums: bisection must drop those writes).
    A poison row therefore waits, pending, over several rounds before it is finished."""

    def process(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        rows = pending.rows
        gathered = len(pending) >= int(self.config.get("gather_rows", 500))
        if gathered or len(pending.ended_partitions) == self.spec.num_partitions:
            sums = rows.group_by("key").aggregate([("value", "sum")])
            txn.add_many(("sum",), sums["key"].combine_chunks(), sums["value_sum"].combine_chunks())
            pending.finish_all()
        poison = rows["value"].filter(_poison(rows["value"], REDUCE_POISON))
        if len(poison):
            raise ValueError(f"process cannot take value {poison[0].as_py()}")
