"""The benchmark workloads as millstream mappers and reducers (what the workers import).

* ``keyed_sum``: :class:`PreAggregate` sums ``value`` per ``key`` within each input batch
  and routes each key by hash; :class:`SumIntoStore` folds the partial sums into int64
  counters ``("sum", key)`` with one batch ``add`` per commit.
* ``smallest``: :class:`RouteRows` only routes rows by key hash (the three smallest payloads
  of a key cannot be combined before the shuffle without knowing the key's state), so every
  row crosses the shuffle; :class:`KeepSmallest` keeps, per key, a counter ``("count",
  key)`` and the three smallest payloads ``("smallest", key)`` (newline-joined; the
  workload's payloads are ASCII letters, digits, ``+`` and ``-``).

* ``counters``: the job the README teaches, in the shapes users vary (the benchmark
  matrix, :mod:`bench.matrix`). :class:`PreAggregateCounters` folds each input batch into
  ``config["counters"]`` counters per key (:mod:`bench.counters`) and routes each key by
  hash; :class:`CountersIntoStore` folds the partial counters and adds them into the store
  with one ``add_many`` (every counter of a key in one value): under ``("stats",)``, one
  keyspace the reducers share (``config["layout"] == "shared"``), or under ``("stats",
  reducer index)``, each reducer's keys together (``"grouped"``).

Every reducer reports its start and its commits through :class:`CommitReporter`: one JSON
line per committed transaction (reducer, shuffle rows, commit time) written to a FIFO named by the
``MILLSTREAM_BENCH_FIFO`` environment variable, so the benchmark times every commit without
writing anything to disk. With ``config["write_output"] = False`` the reducers do all their
work but write no output, which measures the bookkeeping's own writes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.counters import fold, names, per_row
from bench.process_clock import process_cpu, process_started

FIFO_ENV = "MILLSTREAM_BENCH_FIFO"
NAME = "bench"
"""The processor's name (its store prefix)."""
SMALLEST = 3
KEYSPACE = "stats"
"""Where the ``counters`` job keeps a key's counters: ``(KEYSPACE, key)`` when the reducers
share one keyspace, ``(KEYSPACE, reducer index, key)`` when grouped."""
SEPARATOR = "\n"


def open_fifo() -> int:
    """The benchmark's FIFO opened for writing; -1 without one."""
    path = os.environ.get(FIFO_ENV)
    return os.open(path, os.O_WRONLY) if path else -1


def write_record(fd: int, record: dict[str, Any]) -> None:
    """``record`` as one line to the FIFO open as ``fd`` (nothing when it is -1)."""
    if fd >= 0:
        os.write(fd, (json.dumps(record) + "\n").encode())


def send(record: dict[str, Any]) -> None:
    """``record`` as one line to the benchmark's FIFO, opened for it."""
    fd = open_fifo()
    try:
        write_record(fd, record)
    finally:
        if fd >= 0:
            os.close(fd)


def _start_record(role: str, index: int) -> dict[str, Any]:
    """A worker's start: its process's start, its parent's (a Spark task's Python worker
    is forked by PySpark's daemon), now (imports done, store open, processor checked), the
    CPU seconds its process took to get here and the CPU seconds of its parent."""
    return {
        "event": role,
        "i": index,
        "forked": process_started(),
        "parent": process_started(os.getppid()),
        "t": time.time(),
        "cpu": time.process_time(),
        "parent_cpu": process_cpu(os.getppid()),
    }


class StartReporter(ms.Mapper):
    """Base of the benchmark mappers: reports the worker's start and its first ``map``."""

    def __init__(self, spec: ms.WorkerSpec, config: Any) -> None:
        super().__init__(spec, config)
        self._fd = open_fifo()
        write_record(self._fd, _start_record("mapper", spec.index))
        self._mapped = False

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        if not self._mapped:
            self._mapped = True
            write_record(self._fd, {"event": "first map", "i": self.spec.index, "t": time.time()})
        return self.partition(batch)

    def partition(self, batch: pa.RecordBatch) -> ms.Partitioned:
        """The workload's ``map``."""
        raise NotImplementedError


class CommitReporter(ms.Reducer):
    """Base of the benchmark reducers: reports its start, its first rows and each commit
    to the benchmark's FIFO."""

    def __init__(self, spec: ms.WorkerSpec, config: Any) -> None:
        super().__init__(spec, config)
        self.pending_rows = 0
        self.write_output = bool(config.get("write_output", True))
        self._fd = open_fifo()
        write_record(self._fd, _start_record("reducer", spec.index))
        self._reduced = False

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        if not self._reduced:
            self._reduced = True
            write_record(self._fd, {"event": "first rows", "i": self.spec.index, "t": time.time()})
        self.pending_rows = batch.num_rows
        if self.write_output:
            self.write(batch, txn)
        else:
            self.compute(batch)

    def write(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        """Fold ``batch`` into the store (the workload's real work)."""
        raise NotImplementedError

    def compute(self, batch: pa.RecordBatch) -> None:
        """The same computation as :meth:`write` without touching the store."""
        raise NotImplementedError

    def on_commit(self) -> None:
        write_record(self._fd, {"r": self.spec.index, "rows": self.pending_rows, "t": time.time()})


def _table(batch: pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([batch])


class PreAggregate(StartReporter):
    """Sums ``value`` per ``key`` within the batch, then routes each key by hash."""

    def partition(self, batch: pa.RecordBatch) -> ms.Partitioned:
        sums = _table(batch).group_by("key", use_threads=False).aggregate([("value", "sum")])
        sums = sums.rename_columns(["key", "value"])
        return ms.Partitioned.by_hash(sums, key="key", num_reducers=self.spec.num_reducers)


class SumIntoStore(CommitReporter):
    """Folds the partial sums and adds them to the ``("sum", reducer, key)`` counters.

    Each reducer keeps its keys under its own index, so that a commit rewrites the pages
    of its own keys only (keys that interleave with the other reducer's would put both
    reducers' keys on every page: twice the pages per commit).
    """

    @staticmethod
    def _sums(batch: pa.RecordBatch) -> pa.Table:
        return _table(batch).group_by("key", use_threads=False).aggregate([("value", "sum")])

    def write(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        sums = self._sums(batch)
        txn.add_many(
            ("sum", self.spec.index),
            sums["key"].combine_chunks(),
            sums["value_sum"].combine_chunks(),
        )

    def compute(self, batch: pa.RecordBatch) -> None:
        self._sums(batch)


class RouteRows(StartReporter):
    """Routes every row by the hash of its key; nothing is combined before the shuffle."""

    def partition(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


def _smallest_per_key(keys: np.ndarray, payloads: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """The first :data:`SMALLEST` payloads of each key, as newline-joined strings.

    ``keys`` and ``payloads`` are sorted by key, then payload.
    """
    n = len(keys)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    sizes = np.diff(np.r_[starts, n])
    rank = np.arange(n) - np.repeat(starts, sizes)
    keep = rank < SMALLEST
    kept = payloads.filter(pa.array(keep))
    kept_sizes = np.minimum(sizes, SMALLEST)
    offsets = np.r_[0, np.cumsum(kept_sizes)].astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), kept)
    return keys[starts], pc.binary_join(lists, SEPARATOR)


class KeepSmallest(CommitReporter):
    """Per key: the row count and the three smallest payloads, merged with the stored state.

    Each commit reads the stored state of the batch's keys, merges it with the batch's rows
    (sort by key and payload, keep the first three per key) and writes back the keys whose
    three smallest changed; the count is an atomic add. The result does not depend on the
    order in which rows arrive.
    """

    def _merge(
        self, batch: pa.RecordBatch, stored: list[bytes | None] | None, keys: pa.Array
    ) -> tuple[np.ndarray, pa.Array]:
        table = _table(batch).select(["key", "payload"])
        if stored is not None:
            old_keys: list[int] = []
            old_payloads: list[str] = []
            for key, value in zip(keys.to_pylist(), stored, strict=True):
                if value is not None:
                    parts = value.decode().split(SEPARATOR)
                    old_keys += [key] * len(parts)
                    old_payloads += parts
            old = pa.table(
                {
                    "key": pa.array(old_keys, pa.int64()),
                    "payload": pa.array(old_payloads, table.schema.field("payload").type),
                }
            )
            table = pa.concat_tables([table, old])
        order = pc.sort_indices(table, sort_keys=[("key", "ascending"), ("payload", "ascending")])
        table = table.take(order)
        return _smallest_per_key(table["key"].to_numpy(), table["payload"].combine_chunks())

    @staticmethod
    def _counts(batch: pa.RecordBatch) -> pa.Table:
        return _table(batch).group_by("key", use_threads=False).aggregate([([], "count_all")])

    def write(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        counts = self._counts(batch).sort_by("key")
        keys = counts["key"].combine_chunks()
        txn.add_many(("count", self.spec.index), keys, counts["count_all"].combine_chunks())
        stored = txn.get_many(("smallest", self.spec.index), keys)
        merged_keys, smallest = self._merge(batch, stored, keys)
        # Both are in key order. Once a key has many rows, a new row rarely displaces one
        # of its three smallest: write only the keys whose three smallest changed.
        smallest = smallest.cast(pa.binary())
        old = pa.array(stored, pa.binary())
        changed = pc.fill_null(pc.not_equal(old, smallest), True)
        txn.set_many(
            ("smallest", self.spec.index),
            pa.array(merged_keys).filter(changed),
            smallest.filter(changed),
        )

    def compute(self, batch: pa.RecordBatch) -> None:
        self._counts(batch)
        self._merge(batch, None, pa.array([], pa.int64()))


LAYOUTS = ("shared", "grouped")
"""Where a ``counters`` reducer keeps its keys: one keyspace for all, or one per reducer."""


class PreAggregateCounters(StartReporter):
    """Folds the batch into ``config["counters"]`` counters per key, routed by key hash."""

    def partition(self, batch: pa.RecordBatch) -> ms.Partitioned:
        n = int(self.config.get("counters", 1))
        partial = fold(per_row(batch, n), names(n))
        return ms.Partitioned.by_hash(partial, key="key", num_reducers=self.spec.num_reducers)


class CountersIntoStore(CommitReporter):
    """Folds the partial counters and adds them to the store with one ``add_many``: every
    counter of a key in one stored value (:data:`KEYSPACE`), as the README teaches."""

    def __init__(self, spec: ms.WorkerSpec, config: Any) -> None:
        super().__init__(spec, config)
        self.counters = names(int(config.get("counters", 1)))
        self.layout = config.get("layout", "shared")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    def _fold(self, batch: pa.RecordBatch) -> pa.Table:
        return fold(_table(batch), self.counters)

    def write(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        folded = self._fold(batch)
        prefix = (KEYSPACE,) if self.layout == "shared" else (KEYSPACE, self.spec.index)
        txn.add_many(prefix, folded["key"].combine_chunks(), folded.select(list(self.counters)))

    def compute(self, batch: pa.RecordBatch) -> None:
        self._fold(batch)


JOBS: dict[str, tuple[type[ms.Mapper], type[CommitReporter], tuple[str, ...]]] = {
    "keyed_sum": (PreAggregate, SumIntoStore, ("key", "value")),
    "smallest": (RouteRows, KeepSmallest, ("key", "payload")),
    "counters": (PreAggregateCounters, CountersIntoStore, ("key", "value")),
}
"""Workload name: mapper, reducer, and the input columns the job reads."""


def sqlite_url(run_dir: Path) -> str:
    """The benchmark's SQLite store in ``run_dir``."""
    # A 64 MB write-ahead log: a page many commits rewrite is copied back once.
    return f"sqlite:///{run_dir / 'state.db'}?checkpoint_pages=16384"


def build_processor(
    input_dir: Path, kind: str, run_dir: Path, settings: dict[str, Any], *, write_output: bool
) -> ms.Processor:
    """The processor of workload ``kind`` over ``input_dir`` with its store in ``run_dir``.

    ``settings``: ``num_reducers``, ``num_mappers`` (0, the default: one per partition),
    ``batch_rows`` and ``commit_interval_seconds`` (None:
    :class:`millstream.Tuning`'s default); for ``counters``, ``counters`` and ``layout``;
    ``store``: a store URL (such as ``fdb://<cluster file>``) instead of SQLite in ``run_dir``;
    ``tuning``: more :class:`millstream.Tuning` fields and their values.
    """
    knobs = {
        name: settings[name]
        for name in ("batch_rows", "commit_interval_seconds")
        if settings.get(name) is not None
    }
    knobs.update(settings.get("tuning", {}))
    mapper, reducer, columns = JOBS[kind]
    return ms.Processor(
        mapper=mapper,
        reducer=reducer,
        input=ms.inputs.ParquetLog(str(input_dir), columns=columns),
        store=settings.get("store") or sqlite_url(run_dir),
        num_reducers=settings["num_reducers"],
        num_mappers=settings.get("num_mappers", 0),
        name=NAME,
        config={
            "write_output": write_output,
            "counters": settings.get("counters", 1),
            "layout": settings.get("layout", "shared"),
        },
        tuning=ms.Tuning(**knobs),
    )
