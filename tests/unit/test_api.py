"""The user-facing API: Partitioned, the Transaction facade, ParquetLog's reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from millstream.exceptions import ConfigurationError, InputError
from millstream.inputs.parquet_log import ParquetLogReader
from millstream.ledger import OUTPUT
from millstream.state import decode_int64, open_store


def _batch(n: int) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array(range(n), pa.int64()), "s": [str(i) for i in range(n)]})


# -- Partitioned ---------------------------------------------------------------------------


def test_partitioned_needs_one_index_per_row() -> None:
    with pytest.raises(ValueError, match="got 3 rows but 2 reducer indices"):
        ms.Partitioned(_batch(3), pa.array([0, 1], pa.int32()))


def test_partitioned_by_hash_is_stable_and_in_range() -> None:
    batch = _batch(1_000)
    a = ms.Partitioned.by_hash(batch, key="key", num_reducers=7)
    b = ms.Partitioned.by_hash(pa.Table.from_batches([batch]), key=["key"], num_reducers=7)
    assert a.reducer_indices.equals(b.reducer_indices)
    values = a.reducer_indices.to_pylist()
    assert set(values) == set(range(7))
    # Equal keys go to equal reducers wherever they appear.
    reducer_of = dict(zip(a.batch.column("key").to_pylist(), values, strict=True))
    again = ms.Partitioned.by_hash(batch.slice(500), key="key", num_reducers=7)
    keys = again.batch.column("key").to_pylist()
    assert again.reducer_indices.to_pylist() == [reducer_of[k] for k in keys]
    assert sorted(keys) == list(range(500, 1_000))
    # Without the canonical order, rows stay where map put them.
    plain = ms.Partitioned.by_hash(batch, key="key", num_reducers=7, canonical_order=False)
    assert plain.batch.equals(batch)
    assert plain.reducer_indices.to_pylist() == [reducer_of[k] for k in range(1_000)]


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.none()), unique=True),
    seed=st.randoms(use_true_random=False),
)
def test_by_hash_maps_a_permuted_batch_to_the_same_rows(keys: list[int | None], seed: Any) -> None:
    # A map whose output order is unspecified (a threaded group-by) must still give every
    # row the same shuffle index after a restart: the partitioned batch is canonical.
    shuffled = list(keys)
    seed.shuffle(shuffled)
    first = pa.table({"key": pa.array(keys, pa.int64()), "n": pa.array(range(len(keys)))})
    order = {k: i for i, k in enumerate(keys)}
    second = pa.table(
        {"key": pa.array(shuffled, pa.int64()), "n": pa.array([order[k] for k in shuffled])}
    )
    a = ms.Partitioned.by_hash(first, key="key", num_reducers=3)
    b = ms.Partitioned.by_hash(second, key="key", num_reducers=3)
    assert a.batch.equals(b.batch)
    assert a.reducer_indices.equals(b.reducer_indices)
    indices = a.reducer_indices.to_pylist()
    assert indices == sorted(indices)  # grouped by reducer


def test_partitioned_to_reducer_and_with_indices() -> None:
    one = ms.Partitioned.to_reducer(_batch(4), 2)
    assert one.reducer_indices.to_pylist() == [2, 2, 2, 2]
    explicit = ms.Partitioned.with_indices(_batch(3), [0, 1, 0])
    assert explicit.reducer_indices.type == pa.int32()
    empty = ms.Partitioned.to_reducer(pa.table({"key": pa.array([], pa.int64())}), 0)
    assert empty.batch.num_rows == 0


# -- Transaction facade --------------------------------------------------------------------


def test_transaction_maps_keys_under_the_output_keyspace(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}", prefix=("p",))
    try:

        def write(txn: ms.state.Transaction) -> None:  # type: ignore[name-defined]
            facade = ms.Transaction(txn)
            facade.add(("n", 1), 5)
            facade.add(("n", 1), -2)
            facade.set(("v", "a"), b"x")
            facade.add_many(("n",), pa.array([2, 3, 2], pa.int64()), pa.array([1, 1, 1]))
            facade.set_many(("v",), pa.array(["b", "c"]), pa.array([b"y", b"z"]))
            facade.clear(("v", "c"))

        store.transact(write)
        txn = store.create_transaction()
        try:
            facade = ms.Transaction(txn)
            assert facade.get_int(("n", 1)) == 3
            assert facade.get_int(("n", 99)) == 0
            assert facade.get(("v", "a")) == b"x"
            assert facade.get_many(("v",), pa.array(["a", "b", "c"])) == [b"x", b"y", None]
            assert facade.get_range(("n",)) == [
                (("n", 1), (3).to_bytes(8, "little", signed=True)),
                (("n", 2), (2).to_bytes(8, "little", signed=True)),
                (("n", 3), (1).to_bytes(8, "little", signed=True)),
            ]
            raw = txn.get_range_startswith(OUTPUT)
            assert [key for key, _ in raw] == [
                (*OUTPUT, "n", 1),
                (*OUTPUT, "n", 2),
                (*OUTPUT, "n", 3),
                (*OUTPUT, "v", "a"),
                (*OUTPUT, "v", "b"),
            ]
            assert decode_int64(raw[0][1]) == 3
        finally:
            txn.reset()
    finally:
        store.close()


# -- ParquetLog ----------------------------------------------------------------------------


def _log(tmp_path: Path, sizes: list[int]) -> tuple[Path, pa.Table]:
    part = tmp_path / "log" / "partition=0"
    part.mkdir(parents=True)
    start, tables = 0, []
    for i, n in enumerate(sizes):
        table = pa.table({"x": pa.array(range(start, start + n), pa.int64())})
        pq.write_table(table, part / f"f{i:03d}.parquet")
        tables.append(table)
        start += n
    return part, pa.concat_tables(tables)


@pytest.mark.parametrize("step", [1, 7, 100, 250, 1_000])
def test_parquet_log_reads_deterministically_from_tokens(tmp_path: Path, step: int) -> None:
    part, everything = _log(tmp_path, [100, 0, 150, 1, 49])
    reader = ParquetLogReader(part)
    begin, token, pieces, tokens = 0, b"", [], []
    while True:
        result = reader.read(begin, begin + step, token)
        if result.batch is not None:
            assert result.batch.num_rows <= step
            pieces.append(result.batch)
            begin += result.batch.num_rows
        tokens.append((begin, result.continuation_token))
        token = result.continuation_token
        if result.end_of_input:
            break
    assert pa.Table.from_batches(pieces).equals(everything)
    # A new reader (a restarted mapper) resumes from any token to the same rows.
    for at, saved in tokens:
        fresh = ParquetLogReader(part)
        again = fresh.read(at, at + 60, saved)
        want = everything.slice(at, 60).combine_chunks()
        if again.batch is None:
            assert want.num_rows == 0
        else:
            assert pa.Table.from_batches([again.batch]).equals(want)
        fresh.trim(at, saved)  # idempotent
        fresh.trim(at, saved)


def test_parquet_log_end_and_errors(tmp_path: Path) -> None:
    part, _ = _log(tmp_path, [10])
    reader = ParquetLogReader(part)
    first = reader.read(0, 100, b"")
    assert first.end_of_input
    assert first.batch is not None
    assert first.batch.num_rows == 10
    last = reader.read(10, 20, first.continuation_token)
    assert last.batch is None
    assert last.end_of_input
    with pytest.raises(InputError, match="bad ParquetLog continuation token"):
        reader.read(0, 10, b"garbage")
    (part / "f999.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match=r"f999\.parquet"):
        ParquetLogReader(part).read(10, 20, first.continuation_token)


def test_parquet_log_partitions(tmp_path: Path) -> None:
    _log(tmp_path, [5])
    (tmp_path / "log" / "partition=1").mkdir()
    log = ms.inputs.ParquetLog(str(tmp_path / "log"))
    assert log.num_partitions == 2
    with pytest.raises(ConfigurationError, match="out of range"):
        log.reader(2)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigurationError, match="no partition subdirectories"):
        _ = ms.inputs.ParquetLog(str(empty)).num_partitions
