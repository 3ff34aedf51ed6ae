"""The store-backed partitioned input queue."""

from __future__ import annotations

import multiprocessing
import random
import threading

import pyarrow as pa
import pytest
from millstream.exceptions import ConfigurationError, InputError
from millstream.inputs.base import PartitionReader, WaitingReader
from millstream.inputs.store_queue import StoreQueue
from millstream.state import Store


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch(
        {"i": pa.array(range(start, start + n), pa.int64()), "s": [f"row-{k}" for k in range(n)]}
    )


def _read_all(reader: PartitionReader, begin: int = 0, step: int = 1000) -> list[int]:
    out: list[int] = []
    token = b""
    row = begin
    while True:
        result = reader.read(row, row + step, token)
        if result.batch is None or result.batch.num_rows == 0:
            return out
        out.extend(result.batch.column("i").to_pylist())
        row += result.batch.num_rows
        token = result.continuation_token


def test_append_read_trim_seal(store: Store) -> None:
    queue = StoreQueue(store, "events", 2)
    assert queue.append(0, _batch(0, 2500)) == (0, 2500)
    assert queue.append(0, _batch(2500, 10)) == (2500, 2510)
    assert queue.end_row_index(0) == 2510
    assert queue.end_row_index(1) == 0
    reader = queue.reader(0)
    assert isinstance(reader, PartitionReader)
    assert _read_all(reader) == list(range(2510))
    middle = reader.read(1234, 1240, b"")
    assert middle.batch is not None
    assert middle.batch.column("i").to_pylist() == list(range(1234, 1240))
    assert middle.end_of_input is False
    assert reader.read(1234, 1240, b"") == middle
    assert reader.read(2510, 3000, b"").batch is None

    reader.trim(1000, b"")
    reader.trim(500, b"")
    assert queue.first_row_index(0) == 1000
    with pytest.raises(InputError, match="trimmed"):
        reader.read(999, 1000, b"")
    assert _read_all(reader, begin=1000) == list(range(1000, 2510))

    assert not queue.is_sealed(0)
    assert queue.close_partition(0) == 2510
    assert queue.is_sealed(0)
    last = reader.read(2500, 2600, b"")
    assert last.end_of_input is True
    assert reader.read(2510, 2600, b"").end_of_input is True
    with pytest.raises(InputError, match="sealed"):
        queue.append(0, _batch(0, 1))


def test_values_stay_below_the_value_limit(store: Store) -> None:
    queue = StoreQueue(store, "blobs", 1)
    blob = random.Random(7).randbytes(250_000)  # incompressible: stored at its size
    big = pa.record_batch({"b": pa.array([blob, b"y" * 10], pa.binary())})
    queue.append(0, big)
    queue.append(0, big)
    got = queue.reader(0).read(0, 10, b"")
    assert got.batch is not None
    assert got.batch.column("b").to_pylist() == [blob, b"y" * 10] * 2


def test_large_append_spans_transactions(store: Store) -> None:
    queue = StoreQueue(store, "large", 1)
    n = 200_000
    pad = random.Random(7).randbytes(40 * n)  # incompressible: about 10 MB stored
    batch = pa.record_batch(
        {"i": pa.array(range(n), pa.int64()), "pad": [pad[40 * i : 40 * i + 40] for i in range(n)]}
    )
    assert queue.append(0, batch) == (0, n)
    assert _read_all(queue.reader(0), step=70_000) == list(range(n))


def test_schema_and_partition_errors(store: Store) -> None:
    queue = StoreQueue(store, "typed", 2)
    queue.append(1, _batch(0, 3))
    with pytest.raises(InputError, match=r"column 'i' changed from int64 to string"):
        queue.append(1, pa.record_batch({"i": pa.array(["1"])}))
    with pytest.raises(ValueError, match="out of range"):
        queue.append(2, _batch(0, 1))
    with pytest.raises(ConfigurationError, match="2 partitions"):
        StoreQueue(store, "typed", 3)


def _append_many(store: Store, worker: int) -> None:
    queue = StoreQueue(store, "shared", 1)
    for k in range(10):
        queue.append(0, _batch(worker * 1000 + k * 10, 10))
    store.close()


def test_concurrent_appenders_from_processes(store: Store) -> None:
    StoreQueue(store, "shared", 1)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_many, args=(store, w)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    rows = _read_all(StoreQueue(store, "shared", 1).reader(0))
    assert len(rows) == 300
    assert sorted(rows) == sorted(w * 1000 + k for w in range(3) for k in range(100))
    for start in range(0, 300, 10):
        block = rows[start : start + 10]
        assert block == list(range(block[0], block[0] + 10))


def _append_one(store: Store) -> None:
    StoreQueue(store, "woken", 1).append(0, _batch(0, 3))
    store.close()


def test_a_reader_at_the_end_sleeps_until_an_append_or_the_seal(store: Store) -> None:
    queue = StoreQueue(store, "woken", 1)
    reader = queue.reader(0)
    assert isinstance(reader, WaitingReader)
    reader.wait_for_rows(0, 0.01)  # registers the wait: what comes later wakes it
    woken = threading.Event()

    def wait(begin: int) -> None:
        reader.wait_for_rows(begin, 120.0)
        woken.set()

    threading.Thread(target=wait, args=(0,), daemon=True).start()
    child = multiprocessing.get_context("spawn").Process(target=_append_one, args=(store,))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    assert woken.wait(30), "the append did not wake the reader"
    assert _read_all(reader) == [0, 1, 2]

    woken.clear()
    threading.Thread(target=wait, args=(3,), daemon=True).start()
    queue.close_partition(0)
    assert woken.wait(30), "sealing the partition did not wake the reader"
    assert reader.read(3, 10, b"").end_of_input


def test_queue_pickles_for_worker_processes(store: Store) -> None:
    import pickle

    queue = StoreQueue(store, "p", 1)
    queue.append(0, _batch(0, 5))
    clone = pickle.loads(pickle.dumps(queue))
    assert _read_all(clone.reader(0)) == list(range(5))
