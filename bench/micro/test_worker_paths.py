"""Per-batch cost of the worker paths against the user's own work on the same batch.

* Mapper: :meth:`MapperWorker.ingest_once` (read from the reader, check the persisted
  state, record the batch boundaries in the store, ``map``, push into the window) against
  ``map`` alone, with the two store transactions it adds measured apart.
* Reducer: :meth:`ReducerWorker.run_once` (read its state and discovery, GetRows from two
  in-process mappers, decode, ``reduce``, re-check and write its state, commit, acknowledge)
  against ``reduce`` plus a bare commit of the same writes, and ``reduce`` alone.

The difference is millstream's per-batch overhead; on small batches it is what bounds the
rate (and adds to latency), on large ones the user's work dominates.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa
import pytest
from millstream import _core
from millstream.inputs.base import ReadResult
from millstream.ledger import (
    ReducerState,
    read_mapper_state,
    register_worker,
    write_reducer_state,
)
from millstream.state import Store, StoreTransaction, pack
from millstream.testing import InProcessTransport
from millstream.workers import MapperWorker, ReducerWorker
from millstream.workers.prometheus import MULTIPROC_ENV, WorkerMetrics

from bench.micro.conftest import input_batch

SIZES = [1_000, 10_000, 65_536]


class PreAggregate(ms.Mapper):
    """The keyed sum's mapper (``examples/keyed_sum.py``)."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        sums = (
            pa.Table.from_batches([batch])
            .group_by("key", use_threads=False)
            .aggregate([("value", "sum")])
            .rename_columns(["key", "value"])
        )
        return ms.Partitioned.by_hash(sums, key="key", num_reducers=self.spec.num_reducers)


class SumIntoStore(ms.Reducer):
    """The keyed sum's reducer: one batch ``add_many`` per commit."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        sums = (
            pa.Table.from_batches([batch])
            .group_by("key", use_threads=False)
            .aggregate([("value", "sum")])
        )
        txn.add_many(("sum",), sums["key"].combine_chunks(), sums["value_sum"].combine_chunks())


class EndlessReader:
    """The same batch at every row index, forever (no I/O: the worker's cost alone)."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch

    def read(self, begin: int, hint: int, token: bytes) -> ReadResult:
        n = max(1, min(self.batch.num_rows, hint - begin))
        return ReadResult(self.batch.slice(0, n), pack((begin + n,)))

    def trim(self, row_index: int, token: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class EndlessInput:
    """A one-partition input for :class:`EndlessReader` (in-process only)."""

    def __init__(self, batch: pa.RecordBatch, partitions: int = 1) -> None:
        self.batch = batch
        self.partitions = partitions

    @property
    def num_partitions(self) -> int:
        return self.partitions

    def reader(self, partition: int) -> EndlessReader:
        return EndlessReader(self.batch)


def _processor(store: Store, batch: pa.RecordBatch, mappers: int = 1) -> ms.Processor:
    return ms.Processor(
        mapper=PreAggregate,
        reducer=SumIntoStore,
        input=EndlessInput(batch, mappers),
        store=store.url,
        num_reducers=2,
        name="bench",
        tuning=ms.Tuning(batch_rows=batch.num_rows),
    )


# --------------------------------------------------------------------------- mapper


@pytest.fixture(params=SIZES, ids=lambda n: f"{n}rows")
def batch(request: pytest.FixtureRequest) -> pa.RecordBatch:
    return input_batch(request.param)


@pytest.fixture
def mapper(store: Store, batch: pa.RecordBatch) -> Iterator[MapperWorker]:
    worker = MapperWorker(_processor(store, batch), 0, store)
    worker.start_ingestion()
    yield worker
    worker.close()


def _drain(worker: MapperWorker) -> None:
    """Commit everything for every reducer (frees the window) and persist now and then.

    The reducers' states say so in the store as well: the mapper checks its window's claims
    against them before it persists.
    """
    window = worker.window
    assert window is not None
    last = window.snapshot().shuffle_end_row_index - 1
    reducers = range(worker.processor.num_reducers)

    def commit(txn: StoreTransaction) -> None:
        for r in reducers:
            write_reducer_state(txn, r, ReducerState((last,)))

    worker.store.transact(commit)
    for r in reducers:
        worker.handle_get_rows(r, last, 0, 1, worker.guid)
    if worker.batches % 50 == 0:
        worker.trim_input_rows()


class Counted:
    """Calls ``fn`` and counts the calls (a benchmark makes many, ``--benchmark-disable`` one)."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        self.fn()


def test_mapper_ingest_once(benchmark: Any, mapper: MapperWorker, batch: pa.RecordBatch) -> None:
    """The whole ingestion step for one batch (read, checks, plan record, map, push)."""
    benchmark.extra_info["rows"] = batch.num_rows
    ingest = Counted(mapper.ingest_once)
    benchmark.pedantic(ingest, setup=lambda: _drain(mapper), rounds=100, warmup_rounds=5)
    assert mapper.rows_read == ingest.calls * batch.num_rows


def test_mapper_map_alone(benchmark: Any, mapper: MapperWorker, batch: pa.RecordBatch) -> None:
    """The user's ``map`` on the same batch: the raw cost."""
    benchmark.extra_info["rows"] = batch.num_rows
    out = benchmark(mapper.user.map, batch)
    assert out.batch.num_rows > 0


def test_mapper_window_push(benchmark: Any, mapper: MapperWorker, batch: pa.RecordBatch) -> None:
    """Pushing the mapped rows into the Rust window (buckets, accounting)."""
    mapped = mapper.user.map(batch)
    window = mapper.window
    assert window is not None
    state = {"end": window.snapshot().input_end_row_index}

    def push() -> None:
        state["end"] += batch.num_rows
        window.push(mapped.batch, mapped.reducer_indices, state["end"], b"")

    def drain() -> None:
        last = window.snapshot().shuffle_end_row_index - 1
        for r in range(2):
            window.get_rows(r, last, 0, 1)

    benchmark.extra_info["rows"] = mapped.batch.num_rows
    benchmark.pedantic(push, setup=drain, rounds=200, warmup_rounds=5)


def test_mapper_check_persisted_read(benchmark: Any, store: Store) -> None:
    """The split-brain check every batch makes: one read transaction of the mapper state."""

    def check() -> None:
        txn = store.create_transaction()
        try:
            read_mapper_state(txn, 0)
        finally:
            txn.reset()

    benchmark(check)


def test_mapper_plan_batch_commit(benchmark: Any, mapper: MapperWorker) -> None:
    """Recording a batch's boundaries: one small write transaction (an fsync) per batch."""
    state = {"begin": 10**9}

    def plan() -> None:
        state["begin"] += 1000
        mapper.plan_batch(state["begin"], state["begin"] + 1000)

    benchmark(plan)


# --------------------------------------------------------------------------- reducer


class StubMapper:
    """Serves the same mapped rows to every GetRows, at ever higher shuffle indices."""

    def __init__(self, payload: bytes, rows: int) -> None:
        self.payload = payload
        self.rows = rows

    def handle_get_rows(
        self, reducer: int, committed: int, max_rows: int, max_bytes: int, mapper_guid: str
    ) -> tuple[int, int, bytes]:
        if max_rows == 0:
            return 0, committed, b""
        return self.rows, committed + self.rows, self.payload


def _mapped_payload(batch: pa.RecordBatch) -> tuple[bytes, int]:
    """Arrow IPC of the rows one reducer gets from one mapper for ``batch`` (half of them)."""
    mapped = PreAggregate(ms.WorkerSpec("bench", "mapper", 0, "g", 2, 2), {}).map(batch)
    window = _core.Window(2, 1 << 30)
    window.push(mapped.batch, mapped.reducer_indices, batch.num_rows, b"")
    count, _, payload = window.get_rows(0, -1, 1 << 30, 1 << 30)
    return payload, count


@dataclass
class ReducerSetup:
    worker: ReducerWorker
    payload: bytes
    rows_per_round: int


@pytest.fixture
def reducer(store: Store, batch: pa.RecordBatch) -> ReducerSetup:
    payload, rows = _mapped_payload(batch)
    handlers = {f"m{m}": StubMapper(payload, rows) for m in range(2)}
    for m in range(2):
        store.transact(
            lambda txn, m=m: register_worker(txn, "mapper", m, f"guid{m}", f"m{m}", 1e12)
        )
    worker = ReducerWorker(
        _processor(store, batch, mappers=2), 0, store, InProcessTransport(handlers)
    )
    return ReducerSetup(worker, payload, 2 * rows)


def test_reducer_run_once(benchmark: Any, reducer: ReducerSetup) -> None:
    """One reducer round: state and discovery read, 2 GetRows, decode, reduce, commit, ack."""
    benchmark.extra_info["rows_per_round"] = reducer.rows_per_round
    round_ = Counted(reducer.worker.run_once)
    benchmark.pedantic(round_, rounds=100, warmup_rounds=5)
    assert reducer.worker.commits == round_.calls


def test_reducer_run_once_with_metrics(
    benchmark: Any, reducer: ReducerSetup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`test_reducer_run_once` with Prometheus metrics on (observed at each commit)."""
    from prometheus_client import values
    from prometheus_client.mmap_dict import MmapedDict

    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    try:
        reducer.worker.on_committed = WorkerMetrics("reducer", 0).observe_commit
        benchmark.extra_info["rows_per_round"] = reducer.rows_per_round
        round_ = Counted(reducer.worker.run_once)
        benchmark.pedantic(round_, rounds=100, warmup_rounds=5)
        assert reducer.worker.commits == round_.calls
    finally:
        # The metric files stay open for the process's life (a worker's); close this test's.
        for obj in gc.get_objects():
            if isinstance(obj, MmapedDict) and Path(obj._fname).parent == tmp_path:
                obj.close()


def test_reducer_reduce_and_bare_commit(
    benchmark: Any, reducer: ReducerSetup, store: Store
) -> None:
    """The raw cost: decode, the user's ``reduce`` and a commit of just its writes."""
    payload, user = reducer.payload, reducer.worker.user

    def raw() -> None:
        rows = _core.decode_ipc([payload, payload])
        txn = store.create_transaction()
        user.reduce(rows, ms.Transaction(txn))
        txn.commit()

    benchmark.extra_info["rows_per_round"] = reducer.rows_per_round

    benchmark.pedantic(raw, rounds=100, warmup_rounds=5)


def test_reducer_reduce_alone(benchmark: Any, reducer: ReducerSetup, store: Store) -> None:
    """The user's ``reduce`` into a transaction that is not committed (no SQL runs)."""
    rows = _core.decode_ipc([reducer.payload, reducer.payload])
    user = reducer.worker.user

    def reduce_only() -> None:
        txn = store.create_transaction()
        user.reduce(rows, ms.Transaction(txn))
        txn.reset()

    benchmark(reduce_only)
