"""The ``counters`` workload: a keyed aggregation keeping 1, 2 or 4 counters per key.

The job a user writes from the README: the mapper pre-aggregates each input batch per key
and the reducer folds the partial results into int64 counters with ``add_many``. The
counters, in order:

* ``total``: the sum of ``value``;
* ``count``: the number of rows;
* ``squares``: the sum of ``value * value``;
* ``odd``: the number of rows with an odd ``value``.

A job with ``n`` counters keeps the first ``n``. Every counter is a sum of per-row
contributions, so partial results fold in any order and the expected result is one
group-by over the whole input.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

COUNTERS = ("total", "count", "squares", "odd")
CHOICES = (1, 2, 4)
"""Counters per key the benchmark matrix measures."""


def names(n: int) -> tuple[str, ...]:
    """The first ``n`` counters."""
    if n not in CHOICES:
        raise ValueError(f"counters per key must be one of {CHOICES}, got {n}")
    return COUNTERS[:n]


def per_row(table: pa.Table | pa.RecordBatch, n: int) -> pa.Table:
    """``key`` and each row's contribution to each of the first ``n`` counters."""
    value = table["value"]
    contributions = {
        "total": lambda: value,
        "count": lambda: pa.repeat(pa.scalar(1, pa.int64()), table.num_rows),
        "squares": lambda: pc.multiply(value, value),
        "odd": lambda: pc.bit_wise_and(value, pa.scalar(1, pa.int64())),
    }
    return pa.table({"key": table["key"], **{c: contributions[c]() for c in names(n)}})


def fold(table: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """Sum ``columns`` per ``key``: ``key`` then the columns, in the same names."""
    out = table.group_by("key", use_threads=False).aggregate([(c, "sum") for c in columns])
    return pa.table({"key": out["key"], **{c: out[f"{c}_sum"] for c in columns}})


def aggregate(table: pa.Table, n: int) -> pa.Table:
    """The expected result of the ``n``-counter job over ``table``, sorted by key."""
    return fold(per_row(table, n), names(n)).sort_by("key")


def query(table: pa.Table, n: int, *, use_threads: bool = True) -> pa.Table:
    """The ``n``-counter result as one pyarrow query writes it, sorted by key.

    What a user who holds the whole input writes: one ``group_by`` with each counter's own
    aggregation (rows counted with ``count_all``, no column of ones), pyarrow's threads on
    by default. The same result as :func:`aggregate`, at the cost of a bare group-by: the
    single-process floor (:mod:`bench.floor`).
    """
    value = table["value"]
    derived = {
        "squares": lambda: pc.multiply(value, value),
        "odd": lambda: pc.bit_wise_and(value, pa.scalar(1, pa.int64())),
    }
    wanted = names(n)
    columns = {"key": table["key"], "value": value}
    columns.update({c: derived[c]() for c in wanted if c in derived})
    aggregations: dict[str, tuple[Any, str, str]] = {
        "total": ("value", "sum", "value_sum"),
        "count": ([], "count_all", "count_all"),
        "squares": ("squares", "sum", "squares_sum"),
        "odd": ("odd", "sum", "odd_sum"),
    }
    grouped = pa.table(columns).group_by("key", use_threads=use_threads)
    out = grouped.aggregate([aggregations[c][:2] for c in wanted])
    result = {"key": out["key"], **{c: out[aggregations[c][2]] for c in wanted}}
    return pa.table(result).sort_by("key")


def spark_columns(n: int) -> list[Any]:
    """The first ``n`` counters as Spark SQL aggregate expressions."""
    from pyspark.sql import functions as F

    value = F.col("value")
    expressions = {
        "total": F.sum(value),
        "count": F.count(F.lit(1)),
        "squares": F.sum(value * value),
        "odd": F.sum(value.bitwiseAND(F.lit(1))),
    }
    return [expressions[c].alias(c) for c in names(n)]
