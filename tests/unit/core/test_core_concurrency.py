"""The window under concurrent use, and the GIL released while waiting."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
from millstream._core import Window, decode_ipc

MB = 1 << 20


def test_push_in_one_thread_while_others_get_rows() -> None:
    num_reducers, batches, rows = 4, 200, 50
    w = Window(num_reducers, 256 * 1024)
    received: dict[int, list[int]] = {r: [] for r in range(num_reducers)}
    errors: list[BaseException] = []
    total = batches * rows

    def mapper() -> None:
        try:
            for b in range(batches):
                base = b * rows
                batch = pa.record_batch({"v": pa.array(range(base, base + rows), pa.int64())})
                reducers = pa.array(
                    [(base + i) * 7 % num_reducers for i in range(rows)], pa.int32()
                )
                w.push(batch, reducers, base + rows, str(b).encode())
                while not w.wait_for_room(0.05):
                    if w.snapshot().closed:
                        return
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    def reducer(r: int) -> None:
        committed = -1
        try:
            while len(received[r]) < total // num_reducers:
                count, last, payload = w.get_rows(r, committed, 37, 4096)
                if count:
                    received[r].extend(decode_ipc([payload]).column("v").to_pylist())
                    committed = last
                else:
                    time.sleep(0.0005)
            w.get_rows(r, committed, 1, 1)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=mapper)] + [
        threading.Thread(target=reducer, args=(r,)) for r in range(num_reducers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for r in range(num_reducers):
        assert received[r] == [v for v in range(total) if v * 7 % num_reducers == r]
    assert w.local_state() == (total, total, str(batches - 1).encode())
    assert (w.snapshot().buffered_bytes, w.snapshot().buffered_rows, w.snapshot().num_entries) == (
        0,
        0,
        0,
    )


def test_wait_for_room_releases_the_gil() -> None:
    w = Window(1, 4096)
    for i in range(2):
        w.push(
            pa.record_batch({"v": pa.array(range(200), pa.int64())}),
            pa.array([0] * 200, pa.int32()),
            i + 1,
            b"",
        )
    counter = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal counter
        while not stop.is_set():
            counter += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        assert w.wait_for_room(0.3) is False
        during = counter
    finally:
        stop.set()
        spinner.join()
    # Python code ran in another thread while this one waited.
    assert during > 1000


def test_wait_for_room_wakes_when_a_reducer_commits() -> None:
    w = Window(1, 4096)
    for i in range(2):
        w.push(
            pa.record_batch({"v": pa.array(range(200), pa.int64())}),
            pa.array([0] * 200, pa.int32()),
            i + 1,
            b"",
        )
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(w.wait_for_room(30.0)))
    waiter.start()
    w.get_rows(0, 199, 1, 1)
    waiter.join(30)
    assert result == [True]


def test_close_wakes_a_waiter() -> None:
    w = Window(1, 4096)
    for i in range(2):
        w.push(
            pa.record_batch({"v": pa.array(range(200), pa.int64())}),
            pa.array([0] * 200, pa.int32()),
            i + 1,
            b"",
        )
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(w.wait_for_room(float("inf"))))
    waiter.start()
    w.close()
    waiter.join(30)
    assert result == [False]


def test_rows_python_allocated_are_dropped_while_other_threads_read_the_window() -> None:
    # Found by the rescale benchmark: a GetRows thread trimming acknowledged rows dropped
    # NumPy-backed Arrow buffers (their release needs the GIL) while holding the window's
    # lock, and the mapper's thread, holding the GIL, waited for that lock in snapshot():
    # a deadlock. Every method taking the lock now releases the GIL first.
    import numpy as np

    w = Window(2, 1 << 30)
    pushed = 2_000
    for b in range(pushed):
        values = np.arange(b * 64, (b + 1) * 64, dtype=np.int64)  # zero-copy from NumPy
        routes = np.asarray(values % 2, dtype=np.int32)
        w.push(pa.record_batch({"v": pa.array(values)}), pa.array(routes), (b + 1) * 64, b"")
    done = threading.Event()

    def acknowledge() -> None:  # frees the rows both reducers committed, entry by entry
        committed = [-1, -1]
        while committed != [pushed * 64 - 2, pushed * 64 - 1]:
            for r in (0, 1):
                count, last, _ = w.get_rows(r, committed[r], 64, 1 << 20)
                if count:
                    committed[r] = last
        w.get_rows(0, committed[0], 0, 1)
        w.get_rows(1, committed[1], 0, 1)
        done.set()

    thread = threading.Thread(target=acknowledge, daemon=True)
    thread.start()
    while not done.is_set() and thread.is_alive():
        w.snapshot()
        w.bucket_len(0)
    thread.join(60)
    assert done.is_set(), "the window deadlocked between a reader and a trimming thread"
    assert w.snapshot().num_entries == 0
