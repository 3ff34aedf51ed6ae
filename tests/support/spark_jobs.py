"""The Spark runner tests' job, ``examples.keyed_sum`` over a store queue, with its
expected sums, and a Spark run driven from a thread (:class:`Background`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
from millstream.inputs.store_queue import StoreQueue
from millstream.ledger import WorkerInfo, list_workers
from millstream.spark import output_table, run

from examples.keyed_sum import PreAggregate, SumIntoStore

KEYS = 300


NAME = "keyed_sum"


def make_rows(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "key": rng.integers(0, KEYS, rows, dtype=np.int64),
            "value": rng.integers(-1000, 1000, rows, dtype=np.int64),
        }
    )


def expected_sums(*tables: pa.Table) -> dict[int, int]:
    sums = pa.concat_tables(tables).group_by("key").aggregate([("value", "sum")])
    return dict(zip(sums["key"].to_pylist(), sums["value_sum"].to_pylist(), strict=True))


def got_sums(processor: ms.Processor) -> dict[int, int]:
    table = output_table(processor, ("sum",))
    return dict(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True))


def make_processor(tmp_path: Path, partitions: int = 2) -> tuple[ms.Processor, StoreQueue]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    queue = StoreQueue(url, "input", partitions, prefix=(NAME,))
    processor = ms.Processor(
        mapper=PreAggregate,
        reducer=SumIntoStore,
        input=queue,
        store=url,
        num_reducers=2,
        name=NAME,
        tuning=ms.Tuning(batch_rows=2_000, commit_interval_seconds=0.1, heartbeat_seconds=0.2),
    )
    return processor, queue


def workers(processor: ms.Processor, role: str) -> list[WorkerInfo]:
    store = processor.open_store()
    try:
        txn = store.create_transaction()
        try:
            return list_workers(txn, role)
        finally:
            txn.reset()
    finally:
        store.close()


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Background:
    """``millstream.spark.run`` in a thread; ``join`` returns its summary or raises its error."""

    def __init__(self, spark: Any, processor: ms.Processor, **kwargs: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.result = run(spark, processor, **kwargs)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 120) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the Spark run did not return"
        if self.error is not None:
            raise self.error
        return self.result


def append_and_seal(queue: StoreQueue, table: pa.Table) -> None:
    for p in range(queue.num_partitions):
        queue.append(p, table.slice(p * table.num_rows // 2, table.num_rows // 2))
        queue.close_partition(p)
