"""The store queue's records round-trip: what is appended is what any later reader reads.

Records (layout in :mod:`millstream.inputs.store_queue`):

- ``(p, "rows", begin, end, part)``: the rows, as Arrow IPC record-batch messages with
  zstd-compressed buffers split over values (chunks stored uncompressed, as earlier
  releases did, read as they are: the test of compressed chunks below), read back
  through a queue opened anew (as another process reads them), from any row, in reads
  of any size, for every Arrow type a queue accepts; a type it cannot read back
  (dictionary-encoded columns) is refused at the append;
- ``(p, "schema")``: the partition's schema, metadata included; with the schema
  records of :mod:`millstream.inputs.queue_schemas` (``schema_from``, ``schemas``,
  ``unified``) when appends evolve it: every read returns rows in the schema they were
  appended in, before and after trims
  (:func:`test_evolving_appends_read_back_in_their_own_schemas`);
- ``(p, "end")``, ``(p, "first")``, ``(p, "sealed")``: the partition's bounds;
- ``(p, "producer", id)``: a producer's last sequence, read back as
  :meth:`~millstream.inputs.QueueProducer.last_sequence` by a producer started anew, for
  any producer id and any increasing sequence numbers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from millstream.exceptions import DuplicateSequenceError, InputError
from millstream.inputs import queue_chunks
from millstream.inputs.store_queue import PART_BYTES, StoreQueue
from millstream.ledger import QUEUES
from millstream.outputs import StagedOutputs
from millstream.state.transaction import StoreTransaction

from tests.support.schema_jobs import partition_steps


@pytest.fixture
def directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as path:
        yield Path(path)


def _ints(bits: int, signed: bool = True) -> st.SearchStrategy[int]:
    if signed:
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return st.integers(0, 2**bits - 1)


def _cast(kind: pa.DataType, via: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    return lambda values: pa.array(values, via).cast(kind)


def _direct(kind: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    return lambda values: pa.array(values, kind)


def _half(values: list[Any]) -> pa.Array:
    mask = np.array([v is None for v in values])
    data = np.array([0.0 if v is None else v for v in values], dtype=np.float16)
    return pa.array(data, mask=mask)


FLOATS = st.floats(allow_nan=True, allow_infinity=True)
TYPES: dict[str, tuple[st.SearchStrategy[Any], Callable[[list[Any]], pa.Array]]] = {
    "int8": (_ints(8), _direct(pa.int8())),
    "int16": (_ints(16), _direct(pa.int16())),
    "int32": (_ints(32), _direct(pa.int32())),
    "int64": (_ints(64), _direct(pa.int64())),
    "uint8": (_ints(8, False), _direct(pa.uint8())),
    "uint16": (_ints(16, False), _direct(pa.uint16())),
    "uint32": (_ints(32, False), _direct(pa.uint32())),
    "uint64": (_ints(64, False), _direct(pa.uint64())),
    "float16": (st.floats(width=16), _half),
    "float32": (st.floats(width=32), _direct(pa.float32())),
    "float64": (FLOATS, _direct(pa.float64())),
    "decimal": (
        st.decimals(min_value=-(10**8), max_value=10**8, places=2, allow_nan=False),
        _direct(pa.decimal128(12, 2)),
    ),
    "decimal256": (
        st.decimals(min_value=-(10**40), max_value=10**40, places=3, allow_nan=False),
        _direct(pa.decimal256(50, 3)),
    ),
    "bool": (st.booleans(), _direct(pa.bool_())),
    "string": (st.text(max_size=8), _direct(pa.string())),
    "large_string": (st.text(max_size=8), _direct(pa.large_string())),
    "string_view": (st.text(max_size=8), _direct(pa.string_view())),
    "binary": (st.binary(max_size=8), _direct(pa.binary())),
    "fixed_binary": (st.binary(min_size=3, max_size=3), _direct(pa.binary(3))),
    "timestamp_tz": (_ints(64), _cast(pa.timestamp("ns", tz="Europe/Paris"), pa.int64())),
    "timestamp_s": (_ints(64), _cast(pa.timestamp("s"), pa.int64())),
    "duration": (_ints(64), _cast(pa.duration("us"), pa.int64())),
    "date32": (_ints(32), _cast(pa.date32(), pa.int32())),
    "date64": (_ints(64), _cast(pa.date64(), pa.int64())),
    "time64": (st.integers(0, 86_400 * 10**9 - 1), _cast(pa.time64("ns"), pa.int64())),
    "list": (st.lists(_ints(64) | st.none(), max_size=3), _direct(pa.list_(pa.int64()))),
    "large_list": (st.lists(FLOATS, max_size=3), _direct(pa.large_list(pa.float64()))),
    "struct": (
        st.fixed_dictionaries({"a": _ints(32) | st.none(), "b": st.text(max_size=4)}),
        _direct(pa.struct([("a", pa.int32()), ("b", pa.string())])),
    ),
    "map": (
        st.lists(st.tuples(st.text(max_size=3), _ints(64)), max_size=3),
        _direct(pa.map_(pa.string(), pa.int64())),
    ),
    "null": (st.none(), _direct(pa.null())),
    "dictionary": (
        st.text(max_size=3),
        lambda values: pa.array(values, pa.string()).dictionary_encode(),
    ),
}
"""Every Arrow type a queue accepts (and dictionaries, which it refuses), with a strategy
for one value and how to build it."""


@st.composite
def appends(draw: st.DrawFn) -> list[pa.Table]:
    """Batches of one schema (a partition's rows all have one), one to four columns."""
    names = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=4))
    metadata = draw(st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=4)))
    out = []
    for rows in draw(st.lists(st.integers(1, 12), min_size=1, max_size=3)):
        columns = {}
        for i, name in enumerate(names):
            values, build = TYPES[name]
            column = draw(st.lists(values | st.none(), min_size=rows, max_size=rows))
            columns[f"{name}_{i}"] = build(column)
        out.append(pa.table(columns).replace_schema_metadata(metadata))
    return out


def _bits_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every float replaced by the unsigned integer of its width."""
    if pa.types.is_floating(kind):
        return pa.from_numpy_dtype(np.dtype(f"u{kind.bit_width // 8}"))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_bits_type(f.type)) for f in kind])
    if pa.types.is_large_list(kind):
        return pa.large_list(kind.value_field.with_type(_bits_type(kind.value_type)))
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_bits_type(kind.value_type)))
    return kind


def _bits(table: pa.Table) -> pa.Table:
    """The table with floats seen as their bits: NaN equals NaN, -0.0 differs from 0.0."""
    table = table.combine_chunks()
    return pa.table(
        [column.chunk(0).view(_bits_type(column.type)) for column in table.columns],
        names=table.column_names,
    )


def _read(queue: StoreQueue, begin: int, end: int, step: int) -> pa.Table:
    batches = []
    row = begin
    while row < end:
        result = queue.read(0, row, min(step, end - row))
        got = result.batch
        assert got is not None, f"no rows at {row} of {end}"
        assert got.num_rows, f"no rows at {row} of {end}"
        batches.append(got)
        row += got.num_rows
        # Whether the read took the partition's last rows (the mapper then waits).
        assert result.caught_up == (row == end)
    return pa.Table.from_batches(batches)


@settings(max_examples=80)
@given(
    batches=appends(),
    begin=st.integers(0, 30),
    step=st.integers(1, 20),
    compressed=st.booleans(),
)
@example(
    batches=[pa.table({"big": pa.array([b"\x00" * 150_000, None, b"x" * 95_000])})],
    begin=1,
    step=1,
    compressed=True,
).via("values split over several parts")
@example(
    batches=[pa.table({"word": pa.array(["a", "b", "a"]).dictionary_encode()})],
    begin=0,
    step=3,
    compressed=False,
).via("dictionary columns landed, and then no read could decode them")
def test_rows_of_every_type_read_back_as_appended(
    batches: list[pa.Table], begin: int, step: int, compressed: bool
) -> None:
    """Or, for a type the queue cannot read back, the append is refused and stores nothing.
    ``compressed``: every chunk stored compressed, however small (else only chunks from
    :data:`~millstream.inputs.queue_chunks.COMPRESS_MIN_BYTES` are, so these small ones
    would be plain)."""
    refused = any(pa.types.is_dictionary(f.type) for f in batches[0].schema)
    smallest = 0 if compressed else queue_chunks.COMPRESS_MIN_BYTES
    with (
        tempfile.TemporaryDirectory() as directory,
        mock.patch.object(queue_chunks, "COMPRESS_MIN_BYTES", smallest),
    ):
        url = f"sqlite:///{Path(directory) / 'q.db'}"
        writer = StoreQueue(url, "q", 1)
        for batch in batches:
            if refused:
                with pytest.raises(InputError, match="dictionary"):
                    writer.append(0, batch)
            else:
                writer.append(0, batch)
        writer.store.close()
        if refused:
            assert StoreQueue(url, "q", 1).end_row_index(0) == 0
            return
        reader = StoreQueue(url, "q", 1)  # as another process reads them
        try:
            whole = pa.concat_tables(batches)
            end = reader.end_row_index(0)
            assert end == whole.num_rows
            begin = min(begin, end - 1)
            got = _read(reader, begin, end, step)
        finally:
            reader.store.close()
    assert got.schema == whole.schema
    assert got.schema.metadata == whole.schema.metadata
    assert _bits(got).equals(_bits(whole.slice(begin)))


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["a", "b", "a"]).dictionary_encode(),
        pa.array([["a"], [], ["b"]], pa.list_(pa.dictionary(pa.int8(), pa.string()))),
    ],
    ids=["dictionary", "list-of-dictionary"],
)
def test_a_column_the_queue_cannot_read_back_is_refused_at_the_append(
    directory: Path, column: pa.Array
) -> None:
    """Rows of a dictionary column were stored, then every read of them failed (the
    dictionaries are not stored): the append refuses them, naming the column and the fix,
    and leaves the partition as it was; so does a reducer's append to a queue output."""
    queue = StoreQueue(f"sqlite:///{directory / 'q.db'}", "q", 1)
    table = pa.table({"word": column})
    with pytest.raises(InputError, match=r"column 'word' is .*dictionary.*decode it"):
        queue.append(0, table)
    with pytest.raises(InputError, match="column 'word'"):
        queue.producer("p").append(0, table, sequence=0)
    outputs = StagedOutputs([queue], "reducer-0", 0)
    with pytest.raises(InputError, match="column 'word'"):
        outputs.append(queue, table, 0)
    assert queue.end_row_index(0) == 0
    assert queue.producer("p").last_sequence(0) == -1
    plain = pa.array(column.to_pylist())
    queue.append(0, pa.table({"word": plain}))
    read = queue.read(0, 0, 10).batch
    assert read is not None
    assert read.column(0).equals(plain)
    queue.store.close()


def test_chunks_are_stored_compressed_and_uncompressed_ones_still_read(directory: Path) -> None:
    """A chunk of repetitive rows takes a fraction of its Arrow size in the store, a small
    one is stored plain; a chunk an earlier release stored uncompressed (the batch's plain
    IPC message) reads back the same rows."""
    url = f"sqlite:///{directory / 'q.db'}"
    starts = np.repeat(np.arange(20, dtype=np.int64) * 60_000, 500)
    rows = pa.record_batch(
        {"window_start": starts, "key": np.tile(np.arange(500), 20), "n": np.ones(10_000, int)}
    )
    queue = StoreQueue(url, "q", 1)
    queue.append(0, rows)
    space = (*QUEUES, "q", 0, "rows")
    with queue.store.read() as txn:
        chunks = txn.get_range_startswith(space)
    assert [key[-3:-1] for key, _ in chunks] == [(0, rows.num_rows)]
    assert len(b"".join(value for _, value in chunks)) * 10 < rows.nbytes
    small = StoreQueue(url, "small", 1)
    small.append(0, rows.slice(0, 10))  # under COMPRESS_MIN_BYTES: stored plain
    with queue.store.read() as txn:
        stored = txn.get_range_startswith((*QUEUES, "small", 0, "rows"))
    assert [value for _, value in stored] == [rows.slice(0, 10).serialize().to_pybytes()]
    small.store.close()

    def store_uncompressed(txn: StoreTransaction) -> None:
        txn.clear_range_startswith(space)
        plain = rows.serialize().to_pybytes()
        for part, offset in enumerate(range(0, len(plain), PART_BYTES)):
            txn.set((*space, 0, rows.num_rows, part), plain[offset : offset + PART_BYTES])

    queue.store.transact(store_uncompressed)
    queue.store.close()
    reader = StoreQueue(url, "q", 1)
    try:
        got = _read(reader, 0, rows.num_rows, 3_000)
    finally:
        reader.store.close()
    assert got.equals(pa.Table.from_batches([rows]))


PRODUCER_IDS = st.text(min_size=1, max_size=200)


@settings(max_examples=40)
@given(
    producer_id=PRODUCER_IDS,
    steps=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 2**62), st.integers(1, 3)),
        min_size=1,
        max_size=6,
    ),
)
@example(producer_id="\x00", steps=[(0, 2**63 - 1, 1)]).via("largest sequence, NUL id")
def test_a_producer_started_anew_reads_back_its_last_sequences(
    producer_id: str, steps: list[tuple[int, int, int]]
) -> None:
    """Appends with increasing sequence numbers (gaps of any size) to several partitions,
    each followed by a queue and producer opened anew: ``last_sequence`` is the last one
    appended per partition, a repeat of it returns its original rows, an older one is
    refused with the last sequence, and the rows are in the queue once."""
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'q.db'}"
        last: dict[int, int] = {}
        ranges: dict[int, tuple[int, int]] = {}
        rows: dict[int, int] = {}
        for partition, gap, count in steps:
            sequence = min(last.get(partition, -1) + gap, 2**63 - 1)
            if sequence <= last.get(partition, -1):
                continue
            queue = StoreQueue(url, "q", 3)
            producer = queue.producer(producer_id)
            batch = pa.table({"i": pa.array(range(count), pa.int64())})
            ranges[partition] = producer.append(partition, batch, sequence=sequence)
            last[partition] = sequence
            rows[partition] = rows.get(partition, 0) + count
            queue.store.close()
            queue = StoreQueue(url, "q", 3)
            again = queue.producer(producer_id)
            assert [again.last_sequence(p) for p in range(3)] == [last.get(p, -1) for p in range(3)]
            assert again.append(partition, batch, sequence=sequence) == ranges[partition]
            if sequence:
                with pytest.raises(DuplicateSequenceError) as older:
                    again.append(partition, batch, sequence=sequence - 1)
                assert older.value.last_sequence == sequence
            assert [queue.end_row_index(p) for p in range(3)] == [rows.get(p, 0) for p in range(3)]
            queue.store.close()


@settings(max_examples=40)
@given(
    steps=partition_steps(0, dictionaries=False, unsafe=False),
    step=st.integers(1, 30),
    trims=st.lists(st.integers(0, 140), max_size=3),
)
def test_evolving_appends_read_back_in_their_own_schemas(
    steps: list[Any], step: int, trims: list[int]
) -> None:
    """Appends of safely changing schemas, read by a queue opened anew in reads of any
    size: a read never spans a change, each rows' schema is the one appended, and reads
    after trims (which clear the earlier schemas' records) still find theirs."""
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'q.db'}"
        writer = StoreQueue(url, "q", 1)
        spans = []  # (begin, end, batch)
        for sequence, appended in enumerate(steps):
            batch = appended.batch()
            begin, end = writer.append_as(0, batch, "producer", sequence)
            spans.append((begin, end, batch))
        writer.store.close()
        reader = StoreQueue(url, "q", 1)
        try:
            first = 0
            for trim in [*sorted(trims), 0]:
                first = max(first, min(trim, spans[-1][1] - 1))
                reader.trim(0, first)
                row = first
                while row < spans[-1][1]:
                    result = reader.read(0, row, step)
                    got = result.batch
                    assert got is not None
                    stop = row + got.num_rows
                    assert result.caught_up == (stop == spans[-1][1])
                    covered = [
                        batch.slice(max(0, row - begin), min(end, stop) - max(begin, row))
                        for begin, end, batch in spans
                        if begin < stop and row < end
                    ]
                    for piece in covered:
                        assert piece.schema.equals(got.schema), "a read spans a schema change"
                    assert got.equals(
                        pa.Table.from_batches(covered).combine_chunks().to_batches()[0]
                    )
                    row = stop
        finally:
            reader.store.close()
