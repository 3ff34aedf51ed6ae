"""Bisection: the rows a batch's code raises on, found by halving, whatever their number
and place; the rest kept, in order, with what the code returned on them."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from millstream.exceptions import StoreUnavailableError, UserCodeError
from millstream.workers.bisection import Split, split_off_failures


class Code:
    """Raises on a batch holding a value of ``bad``, else returns the batch's sum."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad
        self.calls = 0

    def __call__(self, rows: pa.RecordBatch) -> int:
        self.calls += 1
        found = [v for v in rows["v"].to_pylist() if v in self.bad]
        if found:
            raise ValueError(f"bad value {found[0]}")
        return int(pc.sum(rows["v"]).as_py() or 0)


def batch(n: int) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array(range(100, 100 + n), pa.int64())})


def split(rows: pa.RecordBatch, code: Code) -> Split[int]:
    with pytest.raises(ValueError, match="bad value") as raised:
        code(rows)
    return split_off_failures(rows, code, raised.value)


@pytest.mark.parametrize(
    ("n", "bad"),
    [
        (1, {100}),  # a batch of one, bad
        (16, {107}),  # one bad row
        (16, {100}),  # the first
        (17, {116}),  # the last, an odd count
        (64, {101, 102, 140, 163}),  # several, two of them neighbours
        (9, set(range(100, 109))),  # all bad
        (1000, {100 + 10 * i + 3 for i in range(100)}),  # one in ten
    ],
)
def test_finds_exactly_the_bad_rows_and_keeps_the_rest_in_order(n: int, bad: set[int]) -> None:
    rows = batch(n)
    code = Code(bad)
    result = split(rows, code)
    assert [rows["v"][at].as_py() for at, _ in result.failures] == sorted(bad)
    assert [str(exc) for _, exc in result.failures] == [f"bad value {v}" for v in sorted(bad)]
    kept = [v for v in rows["v"].to_pylist() if v not in bad]
    assert result.kept["v"].to_pylist() == kept
    assert result.result == (sum(kept) if kept else None)


def test_one_bad_row_costs_about_two_calls_per_halving() -> None:
    code = Code({777})
    split(batch(1024), code)
    # The whole batch, then two halves per level of ten, then the kept rows once.
    assert code.calls <= 1 + 2 * math.ceil(math.log2(1024)) + 1


def test_code_that_fails_only_on_rows_together_stops_with_an_error() -> None:
    def pairs(rows: pa.RecordBatch) -> None:
        if rows.num_rows > 2:
            raise ValueError("too many rows at once")

    with pytest.raises(UserCodeError, match=r"on 8 rows together .* but on none of them alone"):
        split_off_failures(batch(8), pairs, ValueError("too many rows at once"), what="test")


def test_store_errors_are_not_the_rows_fault() -> None:
    def store_down(rows: pa.RecordBatch) -> None:
        raise StoreUnavailableError("the store is down")

    with pytest.raises(StoreUnavailableError):
        split_off_failures(
            batch(8), store_down, ValueError("first"), passes=(StoreUnavailableError,)
        )


def test_kept_rows_that_raise_together_are_searched_again() -> None:
    # Row 3 raises alone; the seven rows kept then raise together, on none alone.
    def code(rows: pa.RecordBatch) -> int:
        if 103 in rows["v"].to_pylist():
            raise ValueError("103")
        if rows.num_rows == 7:
            raise ValueError("seven rows")
        return rows.num_rows

    with pytest.raises(UserCodeError, match=r"on 7 rows together \(ValueError\('seven rows'\)\)"):
        split_off_failures(batch(8), code, ValueError("first"))
