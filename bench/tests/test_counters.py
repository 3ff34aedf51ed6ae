"""The counters workload's expected results, computed by hand on a small input."""

from __future__ import annotations

import pyarrow as pa
import pytest

from bench.counters import aggregate, fold, names, per_row, query


def test_the_four_counters_of_each_key() -> None:
    table = pa.table({"key": [2, 1, 2, 2], "value": [3, 4, -5, 6]})
    assert aggregate(table, 4).to_pylist() == [
        {"key": 1, "total": 4, "count": 1, "squares": 16, "odd": 0},
        {"key": 2, "total": 4, "count": 3, "squares": 70, "odd": 2},
    ]


def test_partial_results_fold_into_the_same_result() -> None:
    table = pa.table({"key": [1, 2, 1, 3, 2, 1], "value": [1, 2, 3, 4, 5, 6]})
    halves = [per_row(table.slice(0, 3), 2), per_row(table.slice(3), 2)]
    partial = pa.concat_tables([fold(half, names(2)) for half in halves])
    assert fold(partial, names(2)).sort_by("key").equals(aggregate(table, 2))


def test_other_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="one of"):
        names(3)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("use_threads", [True, False])
def test_the_floors_query_gives_the_same_result(n: int, use_threads: bool) -> None:
    table = pa.table({"key": [5, 1, 5, 3, 1, 5, 7], "value": [3, 4, -5, 6, 1, 0, 9]})
    assert query(table, n, use_threads=use_threads).equals(aggregate(table, n))
