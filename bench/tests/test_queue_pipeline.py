"""The latency pipeline's mapper output and the commit reports' path to the collector."""

from __future__ import annotations

import os
import time

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.queue_pipeline import Collector, TimedPreAggregate, TimedSum, process_cpu_seconds
from bench.queue_producer import SCHEMA


def _batch(n: int, stamps: list[int]) -> pa.RecordBatch:
    rng = np.random.default_rng(4)
    return pa.record_batch(
        [
            pa.array(rng.integers(0, 50, n, dtype=np.int64)),
            pa.array(rng.integers(0, 100, n, dtype=np.int64)),
            pa.array(["p" * 64] * n),
            pa.array(np.repeat(stamps, n // len(stamps)).astype(np.int64)),
        ],
        schema=SCHEMA,
    )


def test_map_keeps_sums_and_counts_rows_per_reducer_and_append() -> None:
    batch = _batch(900, [1_000, 2_000, 3_000])
    spec = ms.WorkerSpec("p", "mapper", 1, "g", 2, 3)
    out = TimedPreAggregate(spec, {}).map(batch)
    rows = out.batch
    timing = pc.greater(rows["append_ns"], 0).to_numpy(zero_copy_only=False)
    reducers = out.reducer_indices.to_numpy()
    # Sums: every key once, the batch's sum.
    sums = rows.filter(pa.array(~timing))
    keys = sums["key"].to_pylist()
    assert len(keys) == len(set(keys))
    assert set(keys) == set(batch["key"].to_pylist())
    assert pc.sum(sums["value"]).as_py() == pc.sum(batch["value"]).as_py()
    # Timing rows: one per (reducer, append time), after the sums, sent to that reducer,
    # counting exactly the input rows whose key goes there.
    assert timing[: sums.num_rows].sum() == 0
    assert timing[sums.num_rows :].all()
    key_reducer = dict(zip(sums["key"].to_pylist(), reducers[~timing].tolist(), strict=True))
    expected: dict[tuple[int, int], int] = {}
    for k, t in zip(batch["key"].to_pylist(), batch["append_ns"].to_pylist(), strict=True):
        expected[(key_reducer[k], t)] = expected.get((key_reducer[k], t), 0) + 1
    got = {
        (int(r), int(t)): int(n)
        for r, t, n, m in zip(
            reducers[timing],
            rows["append_ns"].to_numpy()[timing],
            rows["rows"].to_numpy()[timing],
            rows["key"].to_numpy()[timing],
            strict=True,
        )
        if m == 1
    }
    assert got == expected
    assert (rows["mapped_ns"].to_numpy()[timing] > 0).all()


class _Txn:
    def __init__(self) -> None:
        self.added: dict[tuple[object, ...], int] = {}

    def add_many(self, space: tuple[object, ...], keys: pa.Array, deltas: pa.Array) -> None:
        for k, d in zip(keys.to_pylist(), deltas.to_pylist(), strict=True):
            self.added[(*space, k)] = self.added.get((*space, k), 0) + d

    def add(self, key: tuple[object, ...], delta: int) -> None:
        self.added[key] = self.added.get(key, 0) + delta


def test_reduce_folds_sums_and_on_commit_reports_every_row() -> None:
    collector = Collector()
    try:
        batch = _batch(600, [5_000_000_000, 6_000_000_000])
        spec = ms.WorkerSpec("p", "reducer", 0, "g", 1, 1)
        mapped = TimedPreAggregate(ms.WorkerSpec("p", "mapper", 0, "g", 1, 1), {}).map(batch)
        reducer = TimedSum(spec, {"collector": collector.address})
        txn = _Txn()
        reducer.reduce(pa.concat_batches([mapped.batch, mapped.batch]), txn)  # type: ignore[arg-type]
        sums = {k[1]: v for k, v in txn.added.items() if k[0] == "sum"}
        assert sum(sums.values()) == 2 * pc.sum(batch["value"]).as_py()
        assert txn.added[("rows", 0)] == 1_200
        reducer.on_commit()
        deadline = time.monotonic() + 5
        while collector.rows < 1_200 and time.monotonic() < deadline:
            time.sleep(0.01)
        samples = collector.samples()
        assert samples.total_rows == 1_200
        assert sorted(set(samples.append.tolist())) == [5.0, 6.0]
        assert (samples.latency > 0).all()
        reducer.on_commit()  # nothing pending: nothing sent
        time.sleep(0.05)
        assert collector.rows == 1_200
        reducer.close()
    finally:
        collector.close()


def test_process_cpu_seconds_count_work_and_not_sleep() -> None:
    before = process_cpu_seconds(os.getpid())
    time.sleep(0.2)
    slept = process_cpu_seconds(os.getpid()) - before
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    worked = process_cpu_seconds(os.getpid()) - before - slept
    assert slept < 0.1
    assert 0.2 <= worked <= 1.0
