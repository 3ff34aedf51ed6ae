"""A Parquet sink's records round-trip: every file a commit recorded is listed, with its
rows and bytes, by a sink opened anew (as another process reads it), and its rows read
back as written.

Records: ``SINKS + (name, "file", file_name)`` holds ``(rows, bytes)`` of each recorded
file (:mod:`millstream.outputs.parquet_sink`). Parquet itself has no seconds unit and
no millisecond date: ``timestamp[s]`` and ``time32[s]`` read back in milliseconds and
``date64`` as ``date32``, with the same values (pyarrow's mapping, not the sink's).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st
from millstream.outputs import ParquetSink

INT64 = st.integers(-(2**63), 2**63 - 1)
DAYS = st.integers(-(10**6), 10**6)


def _cast(kind: pa.DataType, via: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    return lambda values: pa.array(values, via).cast(kind)


def _direct(kind: pa.DataType) -> Callable[[list[Any]], pa.Array]:
    return lambda values: pa.array(values, kind)


COLUMNS: dict[str, tuple[st.SearchStrategy[Any], Callable[[list[Any]], pa.Array]]] = {
    "int8": (st.integers(-128, 127), _direct(pa.int8())),
    "uint64": (st.integers(0, 2**64 - 1), _direct(pa.uint64())),
    "float32": (st.floats(width=32), _direct(pa.float32())),
    "float64": (st.floats(), _direct(pa.float64())),
    "decimal": (
        st.decimals(min_value=-(10**12), max_value=10**12, places=3, allow_nan=False),
        _direct(pa.decimal128(18, 3)),
    ),
    "bool": (st.booleans(), _direct(pa.bool_())),
    "string": (st.text(max_size=6), _direct(pa.string())),
    "binary": (st.binary(max_size=6), _direct(pa.binary())),
    "timestamp_tz": (INT64, _cast(pa.timestamp("us", tz="UTC"), pa.int64())),
    "timestamp_s": (st.integers(-(2**40), 2**40), _cast(pa.timestamp("s"), pa.int64())),
    "duration": (INT64, _cast(pa.duration("ns"), pa.int64())),
    "date32": (DAYS, _cast(pa.date32(), pa.int32())),
    "date64": (DAYS.map(lambda d: d * 86_400_000), _cast(pa.date64(), pa.int64())),
    "list": (st.lists(INT64 | st.none(), max_size=3), _direct(pa.list_(pa.int64()))),
    "struct": (
        st.fixed_dictionaries({"a": st.text(max_size=3)}),
        _direct(pa.struct([("a", pa.string())])),
    ),
    "dictionary": (
        st.text(max_size=2),
        lambda values: pa.array(values, pa.string()).dictionary_encode(),
    ),
}

PARQUET_TYPES = {
    pa.timestamp("s"): pa.timestamp("ms"),
    pa.date64(): pa.date32(),
}
"""Types Parquet keeps as another (same values); every other type reads back as written."""


@st.composite
def files(draw: st.DrawFn) -> list[pa.Table]:
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=3, unique=True))
    out = []
    for rows in draw(st.lists(st.integers(1, 8), min_size=1, max_size=3)):
        columns = {}
        for name in names:
            values, build = COLUMNS[name]
            columns[name] = build(draw(st.lists(values | st.none(), min_size=rows, max_size=rows)))
        out.append(pa.table(columns))
    return out


def _comparable(table: pa.Table) -> pa.Table:
    """Floats as bits (NaN equals NaN), dictionaries decoded, Parquet's types applied."""
    columns = []
    for column in table.combine_chunks().columns:
        array = column.chunk(0)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if array.type in PARQUET_TYPES:
            array = pc.cast(array, PARQUET_TYPES[array.type])
        if pa.types.is_floating(array.type):
            array = array.view(pa.from_numpy_dtype(np.dtype(f"u{array.type.bit_width // 8}")))
        columns.append(array)
    return pa.table(columns, names=table.column_names)


@settings(max_examples=30)
@given(tables=files())
def test_recorded_files_are_listed_and_read_back_by_a_sink_opened_anew(
    tables: list[pa.Table],
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'state.db'}"
        out = str(Path(directory) / "out")
        sink = ParquetSink(url, "s", out)
        staged = []
        for i, table in enumerate(tables):
            file = sink.stage(table, f"reducer-{i}")
            sink.store.transact(lambda t, f=file: sink.record_in(t, f))
            sink.publish(file)
            staged.append(file)
        sink.store.close()
        again = ParquetSink(url, "s", out)
        try:
            recorded = again.recorded()
            read = again.read()
        finally:
            again.store.close()
        assert recorded == {f.name: (f.rows, f.size) for f in staged}
        for f in staged:
            assert (Path(out) / f.name).stat().st_size == f.size
    by_name = dict(zip([f.name for f in staged], tables, strict=True))
    written = pa.concat_tables(by_name[name] for name in sorted(by_name))
    assert _comparable(read).equals(_comparable(written))
