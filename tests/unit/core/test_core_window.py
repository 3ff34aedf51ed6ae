"""The native mapper window: pushing, GetRows, trimming, local state, memory, errors."""

from __future__ import annotations

import pyarrow as pa
import pytest
from millstream import _core
from millstream._core import Window
from millstream.exceptions import (
    CommittedIndexError,
    MemoryLimitError,
    MillstreamError,
    SchemaMismatchError,
    WindowError,
)

MB = 1 << 20


def ints(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch({"i": pa.array(range(start, start + n), pa.int64())})


def reducers(*values: int) -> pa.Array:
    return pa.array(values, pa.int32())


def rows_of(window: Window, reducer: int, committed: int, max_rows: int = 1000) -> list[int]:
    count, _, payload = window.get_rows(reducer, committed, max_rows, MB)
    batch = _core.decode_ipc([payload])
    assert batch.num_rows == count
    return batch.column("i").to_pylist() if count else []


def test_module_is_a_release_build() -> None:
    assert _core.__build_profile__ == "release"


def test_push_assigns_shuffle_indices_and_fills_buckets() -> None:
    w = Window(3, MB)
    assert w.push(ints(5), reducers(1, 0, 2, 0, 2), 5, b"t5") == (0, 5)
    assert w.push(ints(2, 5), reducers(2, 2), 9, b"t9") == (5, 7)
    assert [w.bucket_len(r) for r in range(3)] == [2, 1, 4]
    assert [w.pending_shuffle_indices(r) for r in range(3)] == [[1, 3], [0], [2, 4, 5, 6]]
    assert w.bucket_pointer_counts() == [3, 0]
    assert (w.snapshot().num_entries, w.snapshot().first_entry_index) == (2, 0)
    assert (w.snapshot().input_end_row_index, w.snapshot().shuffle_end_row_index) == (9, 7)
    assert w.snapshot().buffered_rows == 7
    assert w.snapshot().buffered_bytes > 0


def test_get_rows_returns_rows_in_shuffle_order_and_does_not_remove_them() -> None:
    w = Window(2, MB)
    w.push(ints(6), reducers(1, 0, 1, 1, 0, 1), 6, b"")
    first = w.get_rows(1, -1, 3, MB)
    assert first == w.get_rows(1, -1, 3, MB)
    count, last, payload = first
    assert (count, last) == (3, 3)
    assert _core.decode_ipc([payload]).column("i").to_pylist() == [0, 2, 3]
    assert rows_of(w, 1, 3) == [5]
    assert rows_of(w, 0, -1) == [1, 4]


def test_no_rows_returns_committed_index_and_no_stream() -> None:
    # Nothing to encode: the GetRows server sends no payload for 0 rows (acknowledgements).
    w = Window(2, MB)
    assert w.get_rows(0, -1, 10, MB) == (0, -1, b"")
    w.push(ints(1), reducers(1), 1, b"")
    assert w.get_rows(0, 7, 10, MB) == (0, 7, b"")
    assert w.get_rows(1, -1, 0, MB) == (0, -1, b"")


def test_trimming_moves_the_local_state_past_fully_committed_entries() -> None:
    w = Window(
        2, MB, input_unread_row_index=100, shuffle_unread_row_index=50, continuation_token=b"s"
    )
    assert w.local_state() == (100, 50, b"s")
    w.push(ints(2), reducers(0, 1), 110, b"a")  # shuffle 50, 51
    w.push(ints(2), reducers(0, 0), 120, b"b")  # shuffle 52, 53
    w.get_rows(0, 50, 10, MB)
    assert w.local_state() == (100, 50, b"s")
    w.get_rows(1, 51, 10, MB)
    assert w.local_state() == (110, 52, b"a")
    assert (w.snapshot().num_entries, w.snapshot().first_entry_index) == (1, 1)
    w.get_rows(0, 53, 10, MB)
    assert w.local_state() == (120, 54, b"b")
    assert (w.snapshot().num_entries, w.snapshot().buffered_rows, w.snapshot().buffered_bytes) == (
        0,
        0,
        0,
    )


def test_empty_batches_advance_the_input() -> None:
    w = Window(2, MB)
    assert w.push(ints(0), reducers(), 10, b"ten") == (0, 0)
    assert w.local_state() == (10, 0, b"ten")
    w.push(ints(1), reducers(0), 11, b"eleven")
    w.push(ints(0), reducers(), 15, b"fifteen")
    assert w.snapshot().num_entries == 2
    w.get_rows(0, 0, 10, MB)
    assert w.local_state() == (15, 1, b"fifteen")
    assert w.snapshot().num_entries == 0


def test_committed_index_beyond_the_window_is_a_watermark() -> None:
    w = Window(2, MB)
    # A restarted mapper: reducer 0 committed up to shuffle index 3 before the restart.
    count, last, _ = w.get_rows(0, 3, 10, MB)
    assert (count, last) == (0, 3)
    w.push(ints(6), reducers(0, 1, 0, 0, 1, 0), 6, b"")
    assert w.pending_shuffle_indices(0) == [5]
    assert rows_of(w, 0, 3) == [5]
    w.get_rows(1, 4, 10, MB)
    w.get_rows(0, 5, 10, MB)
    assert w.local_state()[1] == 6
    assert w.snapshot().buffered_bytes == 0


def test_max_bytes_limits_rows_but_returns_at_least_one() -> None:
    w = Window(1, 64 * MB)
    big = pa.record_batch({"i": pa.array(range(1000), pa.int64()), "s": ["x" * 100] * 1000})
    w.push(big, pa.array([0] * 1000, pa.int32()), 1000, b"")
    count, _, _ = w.get_rows(0, -1, 1000, 1)
    assert count == 1
    count, _, payload = w.get_rows(0, -1, 1000, 20_000)
    assert 50 < count < 500
    assert len(payload) < 40_000


def test_memory_limit_and_wait_for_room() -> None:
    w = Window(1, 4096)
    w.push(ints(200), pa.array([0] * 200, pa.int32()), 200, b"")
    assert w.snapshot().buffered_bytes <= w.snapshot().memory_limit_bytes
    w.push(ints(200, 200), pa.array([0] * 200, pa.int32()), 400, b"")
    assert w.snapshot().buffered_bytes > w.snapshot().memory_limit_bytes
    assert w.wait_for_room(0.01) is False
    w.get_rows(0, 199, 1, 1)
    assert w.wait_for_room(0.0) is True


def test_wait_for_room_can_reserve_the_next_batch() -> None:
    w = Window(1, 4096)
    w.push(ints(200), pa.array([0] * 200, pa.int32()), 200, b"")
    entry = w.snapshot().buffered_bytes
    assert entry <= 4096
    assert w.wait_for_room(0.0) is True
    assert w.wait_for_room(0.0, 4096 - entry) is True
    assert w.wait_for_room(0.01, 4096 - entry + 1) is False, "one byte more would not fit"
    w.get_rows(0, 199, 1, 1)
    assert w.snapshot().buffered_bytes == 0
    assert w.wait_for_room(0.0, 10 * 4096) is True, "an empty window always has room"


def test_a_batch_over_the_limit_on_its_own_is_an_error() -> None:
    w = Window(1, 1000)
    with pytest.raises(MemoryLimitError, match=r"more than the whole memory limit of 1000 bytes"):
        w.push(ints(10_000), pa.array([0] * 10_000, pa.int32()), 10_000, b"")
    assert (w.snapshot().num_entries, w.snapshot().shuffle_end_row_index) == (0, 0)


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        (pa.array([0, 3], pa.int32()), r"reducer index 3 is out of range: this window has 3"),
        (pa.array([0, -1], pa.int64()), r"reducer index -1 is out of range"),
        (pa.array([0], pa.int32()), r"2 rows but 1 reducer indices"),
        (pa.array([0, None], pa.int32()), r"null"),
        (pa.array([0.0, 1.0]), r"expected an integer array"),
    ],
)
def test_bad_reducer_indices(indices: pa.Array, message: str) -> None:
    w = Window(3, MB)
    with pytest.raises(WindowError, match=message):
        w.push(ints(2), indices, 2, b"")


def test_committed_index_errors_name_reducer_and_indices() -> None:
    w = Window(3, MB)
    w.get_rows(2, 10, 1, 1)
    with pytest.raises(
        CommittedIndexError, match=r"reducer 2 sent committed_row_index 9, lower than 10"
    ):
        w.get_rows(2, 9, 1, 1)
    with pytest.raises(CommittedIndexError, match=r"-2, which is beyond what is possible"):
        w.get_rows(1, -2, 1, 1)
    with pytest.raises(WindowError, match=r"reducer index 3 is out of range"):
        w.get_rows(3, -1, 1, 1)
    with pytest.raises(WindowError, match=r"reducer index 3 is out of range"):
        w.bucket_len(3)


def test_schema_changes_are_rejected() -> None:
    w = Window(1, MB)
    w.push(ints(1), reducers(0), 1, b"")
    other = pa.record_batch({"i": pa.array([1], pa.int32())})
    with pytest.raises(
        SchemaMismatchError, match=r"the window has \"i\" Int64, the batch has \"i\" Int32"
    ):
        w.push(other, reducers(0), 2, b"")
    renamed = pa.record_batch({"j": pa.array([1], pa.int64())})
    with pytest.raises(SchemaMismatchError):
        w.push(renamed, reducers(0), 2, b"")
    # An empty batch of any schema only advances the input.
    w.push(pa.record_batch({"x": pa.array([], pa.string())}), reducers(), 3, b"")
    # Schema metadata may differ.
    w.push(ints(1).replace_schema_metadata({"k": "v"}), reducers(0), 4, b"")
    assert w.snapshot().shuffle_end_row_index == 2


def test_input_index_must_not_go_backwards() -> None:
    w = Window(1, MB)
    w.push(ints(1), reducers(0), 10, b"")
    with pytest.raises(
        WindowError, match=r"input_end_row_index 9 is before the window's input end 10"
    ):
        w.push(ints(1), reducers(0), 9, b"")


def test_close_rejects_pushes_and_wakes_waiters() -> None:
    w = Window(1, 4096)
    for i in range(2):
        w.push(ints(200), pa.array([0] * 200, pa.int32()), i + 1, b"")
    w.close()
    assert w.snapshot().closed
    assert w.wait_for_room(10.0) is False
    with pytest.raises(WindowError, match="closed"):
        w.push(ints(1), reducers(0), 2, b"")
    assert w.get_rows(0, -1, 1, 1)[0] == 1


def test_invalid_construction() -> None:
    with pytest.raises(OverflowError):
        Window(-1, MB)
    with pytest.raises(MillstreamError, match="num_reducers"):
        Window(0, MB)
    with pytest.raises(MillstreamError, match=">= 0"):
        Window(1, MB).wait_for_room(-1.0)


def test_repr_names_the_counts() -> None:
    w = Window(2, MB)
    w.push(ints(3), reducers(0, 1, 1), 3, b"")
    assert "num_reducers=2" in repr(w)
    assert "buffered_rows=3" in repr(w)


def _wide(n: int) -> pa.RecordBatch:
    return pa.record_batch(
        {"v": pa.array(range(n), pa.int64()), "s": pa.array([f"{i:0>72}" for i in range(n)])}
    )


def test_a_pyarrow_slice_is_charged_what_it_holds_not_its_parent() -> None:
    # 16 MB of rows; the window of 1 MiB takes a 16 KB slice from the middle of them.
    big = _wide(200_000)
    part = big.slice(100_000, 200)
    w = Window(1, 1 << 20)
    w.push(part, pa.array([0] * 200, pa.int32()), 1, b"")
    assert w.snapshot().buffered_bytes < 4 * part.nbytes
    assert _core.decode_ipc([w.get_rows(0, -1, 1_000, 1 << 30)[2]]) == part


def test_slices_of_one_parent_are_charged_about_the_parent_once() -> None:
    big = _wide(200_000)
    whole = Window(1, 1 << 34)
    whole.push(big, pa.array([0] * 200_000, pa.int32()), 1, b"")
    w = Window(1, 1 << 34)
    for k in range(4):
        w.push(big.slice(k * 50_000, 50_000), pa.array([0] * 50_000, pa.int32()), k + 1, b"")
    # Each slice keeps its rows only (the parent stays with the caller): no part is
    # charged for the parent's other rows, none is charged less than its own rows.
    assert big.nbytes <= w.snapshot().buffered_bytes <= whole.snapshot().buffered_bytes * 1.1
