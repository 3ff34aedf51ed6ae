"""Dead-letter records read back as written, in a store opened anew: the row in every
column type a row may have, the error and where the row was; a record written again is
counted once."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import pyarrow as pa
import pytest
from millstream.exceptions import StoreCorruptError
from millstream.ledger.dead_letters import (
    ERROR_CHARS,
    DeadLetter,
    counter_key,
    dead_letter_counts,
    read_dead_letters,
    record_dead_letters,
)
from millstream.state import open_store

COLUMNS = {
    "i8": pa.array([-8], pa.int8()),
    "i64": pa.array([-(2**63)], pa.int64()),
    "u64": pa.array([2**64 - 1], pa.uint64()),
    "f32": pa.array([1.5], pa.float32()),
    "f64": pa.array([1e308], pa.float64()),
    "bool": pa.array([True]),
    "null_int": pa.array([None], pa.int32()),
    "text": pa.array(["déjà ✓"]),
    "large_text": pa.array(["x" * 1_000], pa.large_string()),
    "bytes": pa.array([b"\x00\xff"], pa.binary()),
    "date": pa.array([datetime.date(2026, 11, 28)], pa.date32()),
    "ts": pa.array([datetime.datetime(2026, 11, 28, 5, 30)], pa.timestamp("us", tz="UTC")),
    "duration": pa.array([datetime.timedelta(seconds=3)], pa.duration("ms")),
    "decimal": pa.array([decimal.Decimal("123.45")], pa.decimal128(10, 2)),
    "list": pa.array([[1, None, 3]], pa.list_(pa.int64())),
    "struct": pa.array([{"a": 1, "b": "z"}], pa.struct([("a", pa.int64()), ("b", pa.string())])),
    "dict": pa.array(["red"]).dictionary_encode(),
    "map": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())),
}


def row() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(COLUMNS.values()), names=list(COLUMNS))


def letters() -> list[DeadLetter]:
    return [
        DeadLetter("map", 1, 2**40, 0, -1, "ValueError('bad')", row()),
        DeadLetter("reduce", 0, 17, 3, 2, "KeyError('x')", row()),
        DeadLetter("map", 0, 5, 0, -1, "e" * (ERROR_CHARS + 10), row().slice(0, 1)),
    ]


def test_records_read_back_in_a_store_opened_anew(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    with open_store(url, ("p",)) as store:
        assert store.transact(lambda txn: record_dead_letters(txn, letters())) == 3
    with open_store(url, ("p",)) as store, store.read() as txn:
        read = read_dead_letters(txn)
        counts = dead_letter_counts(txn)
    expected = sorted(letters(), key=lambda d: (d.stage, d.key))
    assert [(d.stage, d.partition, d.index, d.position, d.reducer) for d in read] == [
        (d.stage, d.partition, d.index, d.position, d.reducer) for d in expected
    ]
    assert [d.error for d in read] == [d.error[:ERROR_CHARS] for d in expected]
    for got in read:
        assert got.row.schema == row().schema
        assert got.row.equals(row())
    assert counts == {("map", 0): 1, ("map", 1): 1, ("reduce", 2): 1}


def test_a_record_written_again_is_not_counted_again(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'state.db'}", ("p",)) as store:
        assert store.transact(lambda txn: record_dead_letters(txn, letters()[:1])) == 1
        # A replay: the same row, and one new beside it.
        assert store.transact(lambda txn: record_dead_letters(txn, letters()[:2])) == 1
        with store.read() as txn:
            assert len(read_dead_letters(txn)) == 2
            assert len(read_dead_letters(txn, "reduce")) == 1
            assert len(read_dead_letters(txn, limit=1)) == 1
            assert dead_letter_counts(txn) == {("map", 1): 1, ("reduce", 2): 1}


def test_a_record_that_does_not_decode_says_so(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'state.db'}", ("p",)) as store:
        key = letters()[0].key
        store.transact(lambda txn: txn.set(key, b"not a record"))
        with store.read() as txn, pytest.raises(StoreCorruptError, match="dead letter"):
            read_dead_letters(txn)
        assert counter_key("map", 1) != key
