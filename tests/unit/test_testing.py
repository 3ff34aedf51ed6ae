"""``millstream.testing``: the in-memory input, the in-process transport and run_in_process."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import UserCodeError
from millstream.rpc.calls import GetRowsCall, GetRowsResult
from millstream.state import decode_int64
from millstream.testing import InProcessTransport, ManualClock, MemoryInput, run_in_process
from millstream.workers import clock as worker_clock


class Split(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class Count(ms.Reducer):
    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        for key in batch.column("key").to_pylist():
            txn.add(("seen", key), 1)


class Failing(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        raise ValueError("bad row")


def test_the_simulation_clock_is_the_workers_manual_clock() -> None:
    assert ManualClock is worker_clock.ManualClock


def test_memory_input_reads_in_batches_and_records_trims() -> None:
    data = MemoryInput([pa.table({"key": list(range(5))}), [pa.record_batch({"key": [7]})]])
    assert data.num_partitions == 2
    reader = data.reader(0)
    first = reader.read(0, 3, b"")
    assert (first.batch.column("key").to_pylist(), first.end_of_input) == ([0, 1, 2], False)
    rest = reader.read(3, 100, first.continuation_token)
    assert (rest.batch.column("key").to_pylist(), rest.end_of_input) == ([3, 4], True)
    reader.trim(3, b"3")
    reader.trim(2, b"2")
    assert reader.trimmed == 3
    assert data.reader(1).read(0, 10, b"").batch.num_rows == 1


def test_the_transport_routes_by_address_and_reports_what_is_unreachable() -> None:
    class Answer:
        def handle_get_rows(
            self, reducer: int, committed: int, max_rows: int, max_bytes: int, mapper_guid: str
        ) -> tuple[int, int, bytes]:
            return 1, committed + 1, mapper_guid.encode()

    transport = InProcessTransport()
    transport.bind("a:1", Answer())
    calls = [
        GetRowsCall(m, address, "g", 0, 4, 10, 100) for m, address in enumerate(["a:1", "b:2"])
    ]
    served, unreachable = transport.get_rows_many(calls)
    assert served == GetRowsResult(1, 5, b"g")
    assert isinstance(unreachable, ConnectionError)
    assert "b:2" in str(unreachable)
    transport.unbind("a:1")
    assert isinstance(transport.get_rows_many(calls[:1])[0], ConnectionError)


def test_run_in_process_commits_every_row_once(tmp_path: Path) -> None:
    keys = [list(range(0, 700)), list(range(300, 1000)), []]
    processor = ms.Processor(
        mapper=Split,
        reducer=Count,
        input=MemoryInput([pa.table({"key": pa.array(k, pa.int64())}) for k in keys]),
        store=f"sqlite:///{tmp_path}/t.db",
        num_reducers=3,
        tuning=ms.Tuning(batch_rows=128),
    )
    run_in_process(processor)
    with processor.open_store() as store, store.read() as txn:
        seen = {k[-1]: decode_int64(v) for k, v in txn.get_range_startswith(("out", "seen"))}
    expected = {k: 2 if 300 <= k < 700 else 1 for k in range(1000)}
    assert seen == expected


def test_run_in_process_raises_what_map_raised(tmp_path: Path) -> None:
    processor = ms.Processor(
        mapper=Failing,
        reducer=Count,
        input=MemoryInput([pa.table({"key": [1, 2]})]),
        store=f"sqlite:///{tmp_path}/t.db",
        num_reducers=1,
    )
    with pytest.raises(UserCodeError, match="bad row"):
        run_in_process(processor)
