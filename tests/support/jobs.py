"""Mappers, reducers and helpers of the integration tests.

Worker processes unpickle these classes by module path (``tests.support.jobs``: the
repository root is on ``sys.path`` and spawn hands ``sys.path`` to every child). Faults are switched
on through the processor's ``config`` so that "fixing the class" is a config change on the
same store (the store's fingerprint records class names, not config).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from millstream import _core
from millstream.ledger import OUTPUT
from millstream.processor import Delivery
from millstream.state import decode_int64

KEYS = 1_000
POISON_KEY = -1
"""A key no generated row has; inputs for the user-error tests carry it in one row."""


def write_keyed_input(
    root: Path,
    rows: int,
    *,
    partitions: int = 2,
    file_rows: int = 10_000,
    seed: int = 3,
    poison_row: tuple[int, int] | None = None,
    unique_values: bool = False,
) -> Path:
    """Parquet files of ``(key int64, value int64)`` under ``root/partition=p/``.

    ``poison_row=(partition, row)`` gives that row the key :data:`POISON_KEY`;
    ``unique_values``: every row's ``value`` is its own (0, 1, 2, ... over all partitions),
    so that a row's effect can be told from every other's.
    """
    rng = np.random.default_rng(seed)
    per_partition = rows // partitions
    for p in range(partitions):
        part = root / f"partition={p}"
        part.mkdir(parents=True, exist_ok=True)
        keys = rng.integers(0, KEYS, per_partition, dtype=np.int64)
        values = rng.integers(-1000, 1000, per_partition, dtype=np.int64)
        if unique_values:
            values = np.arange(p * per_partition, (p + 1) * per_partition, dtype=np.int64)
        if poison_row is not None and poison_row[0] == p:
            keys[poison_row[1]] = POISON_KEY
        for f, start in enumerate(range(0, per_partition, file_rows)):
            stop = min(per_partition, start + file_rows)
            table = pa.table({"key": keys[start:stop], "value": values[start:stop]})
            pq.write_table(table, part / f"part-{f:05d}.parquet")
    return root


def input_table(root: Path) -> pa.Table:
    """Every row of a ParquetLog directory, read independently of millstream."""
    files = sorted(root.glob("*/*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive")


def expected_sums(root: Path) -> dict[int, int]:
    """Sum of ``value`` per ``key``, computed with pyarrow alone."""
    sums = input_table(root).group_by("key").aggregate([("value", "sum")])
    return dict(zip(sums["key"].to_pylist(), sums["value_sum"].to_pylist(), strict=True))


def expected_word_counts(root: Path) -> dict[str, int]:
    """Occurrences per word, computed with pyarrow alone (regex split, value_counts)."""
    lines = input_table(root)["line"]
    words = pc.list_flatten(pc.split_pattern_regex(lines, r"\s+"))
    words = words.filter(pc.greater(pc.utf8_length(words), 0))
    counts = pc.value_counts(words)
    return {
        str(item["values"]): int(item["counts"])
        for item in counts.to_pylist()  # type: ignore[union-attr]
    }


def read_output(processor: ms.Processor, keyspace: str) -> dict[Any, int]:
    """The int64 counters under ``(keyspace, key)`` written by the reducers."""
    store = processor.open_store()
    try:
        txn = store.create_transaction()
        try:
            rows = txn.get_range_startswith((*OUTPUT, keyspace))
        finally:
            txn.reset()
    finally:
        store.close()
    return {key[-1]: decode_int64(value) for key, value in rows}


def _has_poison(batch: pa.RecordBatch) -> bool:
    return bool(pc.any(pc.equal(batch.column("key"), POISON_KEY)).as_py())


class KeyedSumMapper(ms.Mapper):
    """Pre-aggregates ``value`` per ``key`` within the batch, routes keys by hash.

    ``config["fail_map"]``: raise on a batch holding :data:`POISON_KEY`.
    """

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        if self.config.get("fail_map") and _has_poison(batch):
            raise ValueError(f"poisoned key {POISON_KEY} in this batch")
        sums = (
            pa.Table.from_batches([batch])
            .group_by("key", use_threads=False)
            .aggregate([("value", "sum")])
        )
        sums = sums.rename_columns(["key", "value"])
        return ms.Partitioned.by_hash(sums, key="key", num_reducers=self.spec.num_reducers)


class SlowKeyedSumMapper(KeyedSumMapper):
    """:class:`KeyedSumMapper` that sleeps ``config["map_seconds"]`` per batch: a stream
    that lasts long enough for faults injected while it runs."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        time.sleep(float(self.config.get("map_seconds", 0.05)))
        return super().map(batch)


class KeyedSumReducer(ms.Reducer):
    """Adds the partial sums to the ``("sum", key)`` counters.

    ``config["fail_reduce"]``: raise on a batch holding :data:`POISON_KEY`.
    """

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        if self.config.get("fail_reduce") and _has_poison(batch):
            raise ValueError(f"poisoned key {POISON_KEY} reached the reducer")
        sums = pa.Table.from_batches([batch]).group_by("key").aggregate([("value", "sum")])
        values = pc.cast(sums["value_sum"].combine_chunks(), pa.int64())
        txn.add_many(("sum",), sums["key"].combine_chunks(), values)


class KeyGroupSumReducer(KeyedSumReducer):
    """:class:`KeyedSumReducer` that also counts, under ``("misrouted", reducer)``, the
    rows whose key is outside its key groups: after a rescale, none may be."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        super().reduce(batch, txn)
        groups = _core.hash_partition(batch, ["key"], self.spec.key_groups).to_numpy()
        owned = self.spec.key_group_range
        outside = int(((groups < owned.start) | (groups >= owned.stop)).sum())
        if outside:
            txn.add(("misrouted", self.spec.index), outside)


class RowsReducer(ms.Reducer):
    """Counts each row it receives under ``("seen", key)``: duplicates or losses show."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        counts = pa.Table.from_batches([batch]).group_by("key").aggregate([([], "count_all")])
        txn.add_many(
            ("seen",), counts["key"].combine_chunks(), counts["count_all"].combine_chunks()
        )


class ValuesByKeyMapper(ms.Mapper):
    """Combines a batch into one row per key holding the list of its ``value``s: a map whose
    shuffled rows depend on where batches are cut."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        lists = (
            pa.Table.from_batches([batch])
            .group_by("key", use_threads=False)
            .aggregate([("value", "list")])
            .rename_columns(["key", "values"])
        )
        return ms.Partitioned.by_hash(lists, key="key", num_reducers=self.spec.num_reducers)


class SeenValuesReducer(ms.Reducer):
    """Counts every ``value`` it receives under ``("seen", value)``: with unique values,
    a row applied twice counts 2 and a lost row is missing."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        counts = pc.value_counts(pc.list_flatten(batch.column("values")))
        txn.add_many(("seen",), counts.field("values"), pc.cast(counts.field("counts"), pa.int64()))


class SumsToQueueReducer(ms.Reducer):
    """Sums ``value`` per ``key`` within the batch and appends the ``(key, value)`` sums to
    the output queue ``config["queue"]``: the first stage of a pipeline."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        sums = pa.Table.from_batches([batch]).group_by("key", use_threads=False)
        table = sums.aggregate([("value", "sum")]).rename_columns(["key", "value"])
        txn.append(self.config["queue"], table)


class RowsToSinkReducer(ms.Reducer):
    """Publishes every batch it reduces as one Parquet file of ``config["sink"]``."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        txn.write_parquet(self.config["sink"], batch)


class PassThroughMapper(ms.Mapper):
    """Sends every row as it is (no pre-aggregation) to the reducer chosen by its key."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class SlowPassThroughMapper(PassThroughMapper):
    """:class:`PassThroughMapper` that sleeps ``config["map_seconds"]`` per batch."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        time.sleep(float(self.config.get("map_seconds", 0.05)))
        return super().map(batch)


class SlowPaneMapper(ms.event_time.PaneMapper):
    """:class:`~millstream.event_time.PaneMapper` that sleeps ``config["map_seconds"]`` per
    batch: a stream that lasts long enough for faults injected while it runs."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        time.sleep(float(self.config.get("map_seconds", 0.05)))
        return super().map(batch)


def write_event_input(
    root: Path,
    rows: int,
    *,
    partitions: int = 2,
    disorder_ms: int = 5_000,
    seed: int = 7,
    late_every: int = 0,
) -> Path:
    """Parquet files of ``(ts int64 ms, key int64, value int64)`` under
    ``root/partition=p/``: about 100 rows a second per partition, each up to
    ``disorder_ms`` out of order; with ``late_every``, every ``late_every``-th row of each
    partition's second half has a time in the first half minute instead (late, unless its
    pane is still open when it arrives)."""
    rng = np.random.default_rng(seed)
    per_partition = rows // partitions
    for p in range(partitions):
        part = root / f"partition={p}"
        part.mkdir(parents=True, exist_ok=True)
        ts = np.arange(per_partition, dtype=np.int64) * 10
        ts += rng.integers(0, disorder_ms + 1, per_partition)
        if late_every:
            ts[per_partition // 2 :: late_every] %= 30_000
        keys = rng.integers(0, 50, per_partition, dtype=np.int64)
        values = rng.integers(-1000, 1000, per_partition, dtype=np.int64)
        for f, start in enumerate(range(0, per_partition, 10_000)):
            stop = min(per_partition, start + 10_000)
            table = pa.table(
                {"ts": ts[start:stop], "key": keys[start:stop], "value": values[start:stop]}
            )
            pq.write_table(table, part / f"part-{f:05d}.parquet")
    return root


EVENT_DISORDER_MS = 5_000
"""How far :func:`write_event_input`'s rows are out of order, at most."""

_MINUTE_MS = 60_000

EVENT_PANES = ms.event_time.Panes(
    time="ts",
    key="key",
    size=_MINUTE_MS,
    lateness=EVENT_DISORDER_MS,
    aggregates={"n": (None, "count"), "total": ("value", "sum"), "high": ("value", "max")},
    output="per-minute",
)
"""Tumbling minutes per key over :func:`write_event_input`'s rows, late by the disorder."""


def expected_panes(root: Path) -> list[tuple[int, int, int, int, int]]:
    """``(window_start, key, n, total, high)`` of :data:`EVENT_PANES` over the rows
    under ``root``, computed with pyarrow alone."""
    return panes_of(input_table(root))


def panes_of(rows: pa.Table) -> list[tuple[int, int, int, int, int]]:
    """``(window_start, key, n, total, high)`` of :data:`EVENT_PANES` over ``rows``."""
    ts = np.asarray(rows["ts"].to_numpy())
    starts = pa.array((ts // _MINUTE_MS) * _MINUTE_MS)
    table = rows.append_column(ms.event_time.START, starts)
    grouped = table.group_by([ms.event_time.START, "key"]).aggregate(
        [([], "count_all"), ("value", "sum"), ("value", "max")]
    )
    columns = [ms.event_time.START, "key", "count_all", "value_sum", "value_max"]
    return sorted(zip(*(grouped[c].to_pylist() for c in columns), strict=True))


def written_panes(sink: Any) -> list[tuple[int, int, int, int, int]]:
    """``(window_start, key, n, total, high)`` of every pane a ParquetSink received."""
    table = sink.read()
    columns = [ms.event_time.START, "key", "n", "total", "high"]
    return sorted(zip(*(table[c].to_pylist() for c in columns), strict=True))


def panes_with_late(sink: Any, late: Any) -> list[tuple[int, int, int, int, int]]:
    """:func:`written_panes` of ``sink`` with the late rows' aggregates ``late`` received
    added in: what every row, on time or late, makes of the panes."""
    both = pa.concat_tables([sink.read(), late.read()], promote_options="permissive")
    grouped = both.group_by([ms.event_time.START, "key"]).aggregate(
        [("n", "sum"), ("total", "sum"), ("high", "max")]
    )
    columns = [ms.event_time.START, "key", "n_sum", "total_sum", "high_max"]
    return sorted(zip(*(grouped[c].to_pylist() for c in columns), strict=True))


FAST = ms.Tuning(
    batch_rows=3_000,
    commit_interval_seconds=0.05,
    trim_period_seconds=0.2,
    heartbeat_seconds=0.2,
    rpc_timeout_seconds=2.0,
    split_brain_delay_seconds=0.1,
)
"""Small batches and short periods: many batches, commits and trims in a short run."""


def tuning(**changes: Any) -> ms.Tuning:
    """:data:`FAST` with ``changes``."""
    return dataclasses.replace(FAST, **changes)


def keyed_processor(
    data: Path,
    state: Path | str,
    *,
    num_reducers: int = 2,
    config: dict[str, Any] | None = None,
    tune: ms.Tuning = FAST,
    mapper: type[ms.Mapper] = KeyedSumMapper,
    reducer: type[ms.Reducer] = KeyedSumReducer,
    name: str = "keyed",
    delivery: Delivery = "exactly_once",
) -> ms.Processor:
    """A processor over a ParquetLog directory with its store at ``state``: a store URL
    (``sqlite:///...``, ``fdb://...``), or the path of an SQLite file."""
    return ms.Processor(
        mapper=mapper,
        reducer=reducer,
        input=ms.inputs.ParquetLog(str(data)),
        store=state if isinstance(state, str) and "://" in state else f"sqlite:///{state}",
        num_reducers=num_reducers,
        name=name,
        config=config or {},
        tuning=tune,
        delivery=delivery,
    )
