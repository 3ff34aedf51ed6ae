"""Key-by-key comparison catches missing, extra, different and duplicated keys."""

from __future__ import annotations

import pyarrow as pa

from bench.verify import compare


def _t(keys: list[int], totals: list[int | None]) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.int64()), "total": pa.array(totals, pa.int64())})


def test_equal_tables_in_any_order() -> None:
    result = compare(_t([1, 2, 3], [10, None, 30]), _t([3, 1, 2], [30, 10, None]))
    assert result.ok, result.summary()


def test_differences_are_counted() -> None:
    result = compare(_t([1, 2, 3], [10, 20, 30]), _t([1, 2, 4], [10, 21, 40]))
    assert (result.missing, result.unexpected, result.mismatched) == (1, 1, 1)
    assert not result.ok


def test_duplicate_keys_are_mismatches() -> None:
    assert not compare(_t([1], [10]), _t([1, 1], [10, 10])).ok
