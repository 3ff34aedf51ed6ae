"""ParquetLog beyond the basics: row groups, Arrow IPC files, column projection, schemas."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from millstream.exceptions import InputError
from millstream.inputs.parquet_log import ParquetLogReader


def _rows(start: int, n: int) -> pa.Table:
    values = pa.array(range(start, start + n), pa.int64())
    return pa.table({"x": values, "y": pa.compute.multiply(values, 2), "pad": [b"p" * 8] * n})


def _mixed_partition(root: Path) -> tuple[Path, pa.Table]:
    """A Parquet file of several row groups, an IPC file of several batches, and more."""
    part = root / "p0"
    part.mkdir(parents=True)
    first, second, third = _rows(0, 250), _rows(250, 90), _rows(340, 33)
    pq.write_table(first, part / "a.parquet", row_group_size=40)
    with ipc.new_file(str(part / "b.arrow"), second.schema) as writer:
        for batch in second.to_batches(max_chunksize=25):
            writer.write_batch(batch)
    pq.write_table(third, part / "c.parquet")
    return part, pa.concat_tables([first, second, third])


def _read_all(reader: ParquetLogReader, step: int) -> pa.Table:
    begin, token, pieces = 0, b"", []
    while True:
        result = reader.read(begin, begin + step, token)
        if result.batch is not None:
            pieces.append(result.batch)
            begin += result.batch.num_rows
        token = result.continuation_token
        if result.end_of_input:
            return pa.Table.from_batches(pieces)


@pytest.mark.parametrize("step", [1, 17, 64, 1_000])
def test_row_groups_and_ipc_batches_read_in_order(tmp_path: Path, step: int) -> None:
    part, everything = _mixed_partition(tmp_path)
    assert _read_all(ParquetLogReader(part), step).equals(everything.combine_chunks())


def test_columns_are_projected(tmp_path: Path) -> None:
    _, everything = _mixed_partition(tmp_path)
    log = ms.inputs.ParquetLog(str(tmp_path), columns=("y", "x"))
    got = _read_all(log.reader(0), 100)
    assert got.column_names == ["y", "x"]
    assert got.equals(everything.select(["y", "x"]).combine_chunks())
    with pytest.raises(InputError, match=r"column 'z', which no file of the log has"):
        ms.inputs.ParquetLog(str(tmp_path), columns=("z",)).reader(0).read(0, 10, b"")


def _evolved_log(root: Path) -> pa.Table:
    """Partition 0: an old file without ``z``, then files with ``z`` int32 and int64 (a
    widened type); partition 1: only old files. Returns every row of partition 0 as the
    unified schema reads it."""
    old = root / "p0"
    old.mkdir()
    (root / "p1").mkdir()
    pq.write_table(_rows(0, 30), old / "a.parquet", row_group_size=7)
    pq.write_table(_rows(100, 5), root / "p1" / "a.parquet")
    narrow = _rows(30, 10).append_column("z", pa.array([None, *range(9)], pa.int32()))
    with ipc.new_file(str(old / "b.arrow"), narrow.schema) as writer:
        writer.write_table(narrow, max_chunksize=4)
    wide = _rows(40, 6).append_column("z", pa.array(range(6), pa.int64()))
    pq.write_table(wide, old / "c.parquet")
    return pa.concat_tables(
        [t.select(["x", "z"]).cast(pa.schema([("x", pa.int64()), ("z", pa.int64())]))
         for t in (_rows(0, 30).append_column("z", pa.nulls(30, pa.int32())), narrow, wide)]
    )  # fmt: skip


@pytest.mark.parametrize("step", [1, 9, 1_000])
def test_a_column_added_later_reads_as_nulls_in_older_files(tmp_path: Path, step: int) -> None:
    everything = _evolved_log(tmp_path)
    log = ms.inputs.ParquetLog(str(tmp_path), columns=("x", "z"))
    pieces = []
    reader = log.reader(0)
    begin, token = 0, b""
    while True:
        result = reader.read(begin, begin + step, token)
        if result.batch is not None:
            pieces.append(result.batch)
            begin += result.batch.num_rows
        token, ended = result.continuation_token, result.end_of_input
        if ended:
            break
    old = [b for b in pieces if b.column(0)[0].as_py() < 30]  # a.parquet's rows
    assert all(b.schema.field("z").type == pa.int64() for b in old)
    assert sum(b.column(1).null_count for b in old) == 30
    assert all(b.schema.field("z").nullable for b in pieces)
    got = pa.Table.from_batches([b.cast(everything.schema) for b in pieces])
    assert got.equals(everything.combine_chunks())
    # A partition none of whose files has the column reads it from the log's other files.
    other = _read_all(log.reader(1), 100)
    assert other.schema.field("z").type == pa.int64()
    assert other.column("z").null_count == 5
    assert other.column("x").to_pylist() == list(range(100, 105))


def test_a_column_no_file_has_or_not_null_names_column_and_file(tmp_path: Path) -> None:
    _evolved_log(tmp_path)
    missing = ms.inputs.ParquetLog(str(tmp_path), columns=("x", "w"))
    with pytest.raises(InputError, match=r"column 'w', which no file.*p0/a\.parquet"):
        missing.reader(0).read(0, 10, b"")
    strict = _rows(46, 3).append_column("v", pa.array([1, 2, 3], pa.int8()))
    strict = strict.cast(strict.schema.set(3, pa.field("v", pa.int8(), nullable=False)))
    pq.write_table(strict, tmp_path / "p0" / "d.parquet")
    not_null = ms.inputs.ParquetLog(str(tmp_path), columns=("x", "v"))
    with pytest.raises(
        InputError, match=r"column 'v' is not null in input file .*d\.parquet.*p0/a\.parquet"
    ):
        not_null.reader(0).read(0, 10, b"")
    # Nothing was lost: the columns that exist everywhere still read every row.
    assert (
        _read_all(ms.inputs.ParquetLog(str(tmp_path), columns=("x",)).reader(0), 100).num_rows == 49
    )


def test_unsafe_schema_change_is_found_after_a_restart_too(tmp_path: Path) -> None:
    part, _ = _mixed_partition(tmp_path)
    narrowed = _rows(373, 5).set_column(0, "x", pa.array(range(373, 378), pa.int32()))
    pq.write_table(narrowed, part / "d.parquet")
    reader = ParquetLogReader(part)
    resumed = reader.read(0, 373, b"")  # up to the end of c.parquet
    assert resumed.batch is not None
    assert resumed.batch.num_rows == 373
    unsafe = r"schema change inside partition .*d\.parquet.*column 'x' changed from int64 to int32"
    with pytest.raises(InputError, match=unsafe):
        reader.read(373, 400, resumed.continuation_token)
    # A restarted mapper resuming at d.parquet checks it against the files before it.
    with pytest.raises(InputError, match=unsafe):
        ParquetLogReader(part).read(373, 400, resumed.continuation_token)


def test_a_read_stops_where_the_schema_changes(tmp_path: Path) -> None:
    part, _ = _mixed_partition(tmp_path)
    wider = _rows(373, 5).drop_columns(["pad"]).append_column("z", pa.array([1.5] * 5))
    pq.write_table(wider, part / "d.parquet")
    reader = ParquetLogReader(part)
    first = reader.read(0, 1_000, b"")  # a, b and c.parquet, not into d.parquet
    assert first.batch is not None
    assert first.batch.num_rows == 373
    assert first.batch.schema.names == ["x", "y", "pad"]
    second = reader.read(373, 1_000, first.continuation_token)
    assert second.batch is not None
    assert second.batch.schema.names == ["x", "y", "z"]
    assert second.end_of_input


def test_corrupt_row_group_names_the_file(tmp_path: Path) -> None:
    part, _ = _mixed_partition(tmp_path)
    path = part / "a.parquet"
    data = bytearray(path.read_bytes())
    data[200:600] = b"\xff" * 400  # damage the data pages, keep the footer
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"a\.parquet.*Replace or repair the file"):
        _read_all(ParquetLogReader(part), 100)
