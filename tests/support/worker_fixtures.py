"""What the worker tests share: in-memory input, mappers and reducers, and
:class:`Cluster`, the real workers of one processor stepped by hand in one process."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pyarrow.compute as pc
from millstream.ledger import OUTPUT, register_worker
from millstream.rpc.calls import RowsHandler
from millstream.state import Store, decode_int64, open_store
from millstream.state.limits import StoreLimits
from millstream.testing import InProcessTransport
from millstream.workers import ManualClock, MapperWorker, ReducerWorker

ROWS_PER_PARTITION = 1_000
BATCH_ROWS = 100


@dataclass
class MemoryReader:
    """One in-memory partition; the continuation token is the row offset."""

    table: pa.Table
    trims: list[int] = field(default_factory=list)
    bounded: bool = True
    visible: list[int] = field(default_factory=list)

    def read(self, begin_row_index: int, end_row_index_hint: int, token: bytes) -> ms.ReadResult:
        offset = struct.unpack("<q", token)[0] if token else 0
        assert offset == begin_row_index
        available = min(self.visible[0], self.table.num_rows) if self.visible else None
        last = self.table.num_rows if available is None else available
        take = min(end_row_index_hint - begin_row_index, last - offset)
        end = offset + max(take, 0)
        batch = self.table.slice(offset, max(take, 0)).combine_chunks().to_batches()
        done = self.bounded and end >= self.table.num_rows
        return ms.ReadResult(batch[0] if batch else None, struct.pack("<q", end), done)

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        self.trims.append(row_index)

    def close(self) -> None:
        pass


@dataclass
class MemoryInput:
    """Partitions held in memory; ``bounded=False`` never reports the end of input.

    ``visible``: when set (one shared number), only that many rows of each partition are
    readable so far, as in a queue that is still being appended to.
    """

    tables: list[pa.Table]
    bounded: bool = True
    visible: list[int] = field(default_factory=list)

    @property
    def num_partitions(self) -> int:
        return len(self.tables)

    def reader(self, partition: int) -> MemoryReader:
        return MemoryReader(self.tables[partition], bounded=self.bounded, visible=self.visible)


class PassThrough(ms.Mapper):
    """Routes each row by its key.

    ``config["fail_map"]``: raise on a batch holding key -1; ``config["flaky"]``: raise on
    the first that many calls of this instance.
    """

    calls = 0

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        self.calls += 1
        if self.calls <= int(self.config.get("flaky", 0)):
            raise RuntimeError(f"flaky map, call {self.calls}")
        if self.config.get("fail_map") and pc.any(pc.equal(batch["key"], -1)).as_py():
            raise ValueError("poisoned row")
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class WideningMapper(ms.Mapper):
    """Adds a column whose type depends on the mapper: int64, or ``config["other"]``."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        kind = pa.int64() if self.spec.index == 0 else self.config["other"]
        column = pc.cast(batch["key"], kind)
        wide = pa.RecordBatch.from_arrays([batch["key"], column], names=["key", "w"])
        return ms.Partitioned.by_hash(wide, key="key", num_reducers=self.spec.num_reducers)


class CountRows(ms.Reducer):
    """Counts rows per key: a lost row or a duplicate shows in the counts."""

    calls = 0

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        self.calls += 1
        if self.calls <= int(self.config.get("flaky", 0)):
            raise RuntimeError(f"flaky reduce, call {self.calls}")
        if self.config.get("fail_reduce") and pc.any(pc.equal(batch["key"], -1)).as_py():
            raise ValueError("poisoned row")
        counts = pa.Table.from_batches([batch]).group_by("key").aggregate([([], "count_all")])
        txn.add_many(("n",), counts["key"].combine_chunks(), counts["count_all"].combine_chunks())
        if self.config.get("big_values"):
            keys = batch["key"]
            txn.set_many(("blob",), keys, pa.array([b"x" * 2_000] * len(keys), pa.binary()))


def tables(partitions: int = 2, poison: int | None = None) -> list[pa.Table]:
    out = []
    for p in range(partitions):
        keys = [(i * 7 + p) % 50 for i in range(ROWS_PER_PARTITION)]
        if poison is not None and p == 0:
            keys[poison] = -1
        out.append(pa.table({"key": pa.array(keys, pa.int64())}))
    return out


def expected_counts(tables: list[pa.Table]) -> dict[int, int]:
    counts = pa.concat_tables(tables).group_by("key").aggregate([([], "count_all")])
    return dict(zip(counts["key"].to_pylist(), counts["count_all"].to_pylist(), strict=True))


class PreAggregating(ms.Mapper):
    """Counts each key within the batch: its output depends on where batches begin and end."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        table = pa.Table.from_batches([batch])
        counts = table.group_by("key", use_threads=False).aggregate([([], "count_all")])
        counts = counts.rename_columns(["key", "n"])
        return ms.Partitioned.by_hash(counts, key="key", num_reducers=self.spec.num_reducers)


class AddCounts(ms.Reducer):
    """Adds the partial counts of :class:`PreAggregating` under ``("n", key)``."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch])
        sums = table.group_by("key", use_threads=False).aggregate([("n", "sum")])
        txn.add_many(("n",), sums["key"].combine_chunks(), sums["n_sum"].combine_chunks())


@dataclass
class ConflictingCommits:
    """Makes every ``every``-th reducer commit fail with a conflict, as if another instance
    had committed first (:meth:`install` patches ``ReplayingTransaction.commit``)."""

    every: int = 3
    calls: int = 0

    def install(self, monkeypatch: object) -> None:
        from millstream.exceptions import StoreConflictError
        from millstream.state.replay import ReplayingTransaction

        real = ReplayingTransaction.commit

        def commit(txn: ReplayingTransaction) -> None:
            self.calls += 1
            if self.calls % self.every == 0:
                raise StoreConflictError("another instance committed first (injected)")
            real(txn)

        monkeypatch.setattr(ReplayingTransaction, "commit", commit)  # type: ignore[attr-defined]


def output_counts(store_url: str, name: str, keyspace: str = "n") -> dict[int, int]:
    """The int64 counters a processor named ``name`` wrote under ``(keyspace, key)``."""
    from millstream.state import open_store

    store = open_store(store_url, prefix=(name,))
    try:
        with store.read() as txn:
            rows = txn.get_range_startswith(("out", keyspace))
    finally:
        store.close()
    return {int(key[-1]): int.from_bytes(value, "little", signed=True) for key, value in rows}


class Cluster:
    """Workers of one processor in this process, stepped by the test."""

    def __init__(
        self,
        tmp_path: Path,
        tables: list[pa.Table],
        *,
        num_reducers: int = 2,
        config: dict[str, object] | None = None,
        limits: StoreLimits | None = None,
        mapper: type[ms.Mapper] = PassThrough,
        reducer: type[ms.Reducer] = CountRows,
        visible: list[int] | None = None,
        outputs: list[ms.outputs.Output] | None = None,
        **tuning: object,
    ) -> None:
        self.tables = tables
        self.processor = ms.Processor(
            mapper=mapper,
            reducer=reducer,
            input=MemoryInput(tables, visible=visible if visible is not None else []),
            store=f"sqlite:///{tmp_path / 'state.db'}",
            num_reducers=num_reducers,
            config=config or {},
            tuning=ms.Tuning(batch_rows=BATCH_ROWS, **tuning),  # type: ignore[arg-type]
            outputs=outputs or [],
        )
        self.store: Store = open_store(self.processor.store, (self.processor.name,), limits)
        self.clock = ManualClock()
        self.handlers: dict[str, RowsHandler] = {}
        self.mappers: dict[int, MapperWorker] = {}
        self.reducers: dict[int, ReducerWorker] = {}
        for m in range(self.processor.num_partitions):
            self.start_mapper(m)
        for r in range(num_reducers):
            self.start_reducer(r)

    def start_mapper(self, index: int, *, register: bool = True) -> MapperWorker:
        worker = MapperWorker(self.processor, index, self.store, clock=self.clock)
        worker.start_ingestion()
        address = f"mapper-{index}-{worker.guid}"
        self.handlers[address] = worker
        if register:
            self.clock.advance(1.0)
            self.store.transact(
                lambda txn: register_worker(
                    txn, "mapper", index, worker.guid, address, self.clock.wall()
                )
            )
            self.mappers[index] = worker
        return worker

    def start_reducer(self, index: int) -> ReducerWorker:
        client = InProcessTransport(self.handlers)
        worker = ReducerWorker(self.processor, index, self.store, client, clock=self.clock)
        self.reducers[index] = worker
        return worker

    def step(self) -> None:
        """Every mapper ingests a batch, every reducer runs once, every mapper trims."""
        for mapper in self.mappers.values():
            if not mapper.end_of_input:
                mapper.ingest_once()
        for reducer in self.reducers.values():
            reducer.run_once()
        for mapper in self.mappers.values():
            mapper.trim_input_rows()

    def run_to_end(self, limit: int = 500) -> None:
        for _ in range(limit):
            self.step()
            if all(m.is_drained() for m in self.mappers.values()):
                return
        raise AssertionError("the processor did not drain")

    def output(self, keyspace: str = "n") -> dict[int, int]:
        txn = self.store.create_transaction()
        try:
            rows = txn.get_range_startswith((*OUTPUT, keyspace))
        finally:
            txn.reset()
        return {key[-1]: decode_int64(value) for key, value in rows}
