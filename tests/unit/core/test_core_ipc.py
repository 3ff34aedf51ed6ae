"""Rows of many Arrow types through the window and IPC, and decode_ipc on the reducer side."""

from __future__ import annotations

import pyarrow as pa
import pytest
from millstream._core import MillstreamError, Window, decode_ipc

MB = 1 << 20


def mixed(n: int, start: int = 0) -> pa.RecordBatch:
    idx = range(start, start + n)
    return pa.record_batch(
        {
            "i8": pa.array([i % 100 for i in idx], pa.int8()),
            "i64": pa.array([None if i % 7 == 0 else i for i in idx], pa.int64()),
            "u32": pa.array(list(idx), pa.uint32()),
            "f64": pa.array([i / 3 if i % 5 else None for i in idx], pa.float64()),
            "s": pa.array([f"row {i}" if i % 4 else None for i in idx]),
            "ls": pa.array([f"large {i}" for i in idx], pa.large_string()),
            "b": pa.array([bytes([i % 256]) * (i % 5) for i in idx], pa.binary()),
            "lst": pa.array(
                [[i, None, i + 1] if i % 3 else None for i in idx], pa.list_(pa.int64())
            ),
            "nested": pa.array([[["a"] * (i % 3)] for i in idx], pa.list_(pa.list_(pa.string()))),
            "st": pa.array([{"x": i, "y": str(i)} for i in idx]),
            "d": pa.array(
                [["red", "green", None][i % 3] for i in idx], pa.string()
            ).dictionary_encode(),
            "bool": pa.array([i % 2 == 0 for i in idx]),
            "ts": pa.array(list(idx), pa.timestamp("us")),
        }
    )


def test_mixed_types_round_trip_through_the_window() -> None:
    num_reducers = 3
    w = Window(num_reducers, 64 * MB)
    batches = [mixed(50, 0), mixed(1, 50), mixed(80, 51)]
    assignments = [
        pa.array([(i * 7 + len(b)) % num_reducers for i in range(len(b))], pa.int32())
        for b in batches
    ]
    end = 0
    for b, a in zip(batches, assignments, strict=True):
        end += b.num_rows
        w.push(b, a, end, str(end).encode())
    everything = pa.Table.from_batches(batches).combine_chunks()
    reducer_of = [r for a in assignments for r in a.to_pylist()]
    for r in range(num_reducers):
        expected_rows = [i for i, x in enumerate(reducer_of) if x == r]
        count, last, payload = w.get_rows(r, -1, 10_000, 64 * MB)
        assert count == len(expected_rows)
        assert last == expected_rows[-1]
        got = decode_ipc([payload])
        assert got.schema == batches[0].schema
        expected = everything.take(expected_rows)
        for name in expected.column_names:
            got_column, expected_column = got.column(name), expected.column(name).combine_chunks()
            if pa.types.is_dictionary(got_column.type):
                # Concatenation merges dictionaries: compare values, not layout.
                got_column = got_column.dictionary_decode()
                expected_column = expected_column.dictionary_decode()
            assert got_column.equals(expected_column), name
        # pyarrow reads the same stream.
        assert pa.ipc.open_stream(payload).read_all().to_pylist() == expected.to_pylist()


def test_sliced_reads_across_entries_round_trip() -> None:
    w = Window(2, 64 * MB)
    batches = [mixed(40, 0), mixed(40, 40)]
    for i, b in enumerate(batches):
        w.push(b, pa.array([j % 2 for j in range(40)], pa.int32()), 40 * (i + 1), b"")
    everything = pa.Table.from_batches(batches).combine_chunks()
    seen: list[int] = []
    committed = -1
    while True:
        count, last, payload = w.get_rows(1, committed, 7, 64 * MB)
        if count == 0:
            break
        got = decode_ipc([payload])
        seen.extend(got.column("u32").to_pylist())
        committed = last
    assert seen == list(range(1, 80, 2))
    assert pa.Table.from_batches([decode_ipc([])]).num_rows == 0
    assert everything.num_rows == 80


def test_decode_ipc_concatenates_payloads_of_several_mappers() -> None:
    payloads = []
    for m in range(3):
        w = Window(1, 64 * MB)
        w.push(mixed(10, 10 * m), pa.array([0] * 10, pa.int32()), 10, b"")
        payloads.append(w.get_rows(0, -1, 100, 64 * MB)[2])
    empty = Window(1, MB).get_rows(0, -1, 10, MB)[2]
    got = decode_ipc([payloads[0], empty, payloads[1], b"", payloads[2]])
    # Concatenation merges the dictionaries, so compare values, not physical layout.
    assert got.schema == mixed(30).schema
    assert got.to_pylist() == mixed(30).to_pylist()
    # bytearray works too.
    assert decode_ipc([bytearray(payloads[0])]).num_rows == 10


def test_decode_ipc_keeps_the_schema_of_row_less_payloads() -> None:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, mixed(1).schema):
        pass
    got = decode_ipc([sink.getvalue().to_pybytes()])
    assert (got.num_rows, got.schema) == (0, mixed(1).schema)


def test_decode_ipc_of_one_payload_points_into_it() -> None:
    w = Window(1, 64 * MB)
    w.push(mixed(1_000), pa.array([0] * 1_000, pa.int32()), 1_000, b"")
    payload = w.get_rows(0, -1, 10_000, 64 * MB)[2]
    start = pa.py_buffer(payload).address
    got = decode_ipc([payload])
    values = got.column("i64").buffers()[1]
    assert start <= values.address < start + len(payload)
    assert got.column("i64").to_pylist() == mixed(1_000).column("i64").to_pylist()


def test_decode_ipc_rejects_garbage_and_mixed_schemas() -> None:
    with pytest.raises(MillstreamError, match="cannot decode the Arrow IPC payloads"):
        decode_ipc([b"\x01\x02\x03\x04\x05\x06\x07\x08\x09"])
    a = pa.record_batch({"x": [1]})
    b = pa.record_batch({"y": ["s"]})
    streams = []
    for batch in (a, b):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        streams.append(sink.getvalue().to_pybytes())
    with pytest.raises(MillstreamError):
        decode_ipc(streams)
