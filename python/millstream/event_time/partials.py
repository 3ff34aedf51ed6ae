"""Partial aggregates in Arrow: assign rows to panes, combine, merge, finish, encode.

A *partial* is what can be merged without the rows: a count, a sum, a minimum, a maximum
(a mean is a sum and a count). Mappers combine the rows of one batch into partials per
``(pane start, key)``; reducers merge partials with group-bys and finish them into the
aggregates when a pane closes. No Python loop runs per key or per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.event_time.aggregation import Panes
from millstream.exceptions import ConfigurationError

START = "window_start"
"""The column of a pane's start (the name earlier releases wrote, kept for the output)."""
END = "window_end"
"""The column of a pane's end, in the output."""
GLOBAL_KEY = "key"
"""The key column's name when the aggregation has no key (one global key, 0)."""
ROWS = "_rows"
"""The column counting each partial's input rows when no aggregate counts them (the
reducers count late rows in input rows); merges and the store leave it out."""

_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}


def _is_key_type(kind: pa.DataType) -> bool:
    """Key types the panes group, sort, route and store (as tuple-key elements)."""
    return bool(
        pa.types.is_integer(kind)
        or kind in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())
    )


@dataclass(frozen=True)
class Plan:
    """The partial columns of an aggregation and how each merges.

    Attributes:
        partials: ``(partial column, input column, function)``, function one of count, sum,
            min, max; one per distinct input column and function.
        key: The key column's name in partial tables.
    """

    partials: tuple[tuple[str, str | None, str], ...]
    key: str

    @classmethod
    def of(cls, panes: Panes) -> Plan:
        """The partials ``panes``' aggregates need (aggregated columns have no nulls, so
        every count is a count of rows)."""
        needed: dict[tuple[str | None, str], str] = {}
        for column, function in panes.aggregates.values():
            if function == "count":
                parts: list[tuple[str | None, str]] = [(None, "count")]
            elif function == "mean":
                parts = [(column, "sum"), (None, "count")]
            else:
                parts = [(column, function)]
            for part in parts:
                needed.setdefault(part, f"_p{len(needed)}")
        partials = tuple((name, column, fn) for (column, fn), name in needed.items())
        return cls(partials, panes.key or GLOBAL_KEY)

    def name(self, column: str | None, function: str) -> str:
        for name, source, fn in self.partials:
            if (source, fn) == (column, function):
                return name
        raise KeyError((column, function))

    @property
    def names(self) -> list[str]:
        """The partial columns, in order."""
        return [name for name, _, _ in self.partials]

    @property
    def rows(self) -> str:
        """The column counting each partial's input rows: the aggregation's own count, or
        :data:`ROWS`, which the mapper adds when no aggregate counts rows."""
        for name, source, function in self.partials:
            if (source, function) == (None, "count"):
                return name
        return ROWS


def pane_starts(ticks: np.ndarray, size: int, slide: int) -> tuple[np.ndarray, np.ndarray]:
    """``(row, start)`` of every pane each row belongs to: ``size // slide`` per row."""
    base = (ticks // slide) * slide
    per_row = size // slide
    rows = np.repeat(np.arange(len(ticks)), per_row)
    starts = np.repeat(base, per_row) - np.tile(np.arange(per_row) * slide, len(ticks))
    return rows, starts


def time_ticks(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int64 view of the time column (a timestamp's ticks in its unit).

    Raises:
        ConfigurationError: The column has nulls or is not an integer or timestamp.
    """
    if column.null_count:
        raise ConfigurationError("the time column has nulls: every row needs an event time")
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    elif not pa.types.is_integer(column.type):
        raise ConfigurationError(
            f"the time column must be an integer or a timestamp column, got {column.type}"
        )
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def combine(table: pa.Table, panes: Panes, plan: Plan) -> tuple[pa.Table, int, pa.DataType]:
    """Rows to partials per ``(pane start, key)``, with :attr:`Plan.rows` counting their
    input rows; also the largest event time and the time column's type.

    Raises:
        ConfigurationError: A column is missing, the key column is not an integer, string
            or binary, or an aggregated column has nulls or a type whose partials the store
            cannot keep exactly (:func:`value_type_error`).
    """
    missing = [
        c
        for c in [panes.time, panes.key, *(src for _, src, _ in plan.partials)]
        if c is not None and c not in table.column_names
    ]
    if missing:
        raise ConfigurationError(
            f"the rows have no column(s) {missing}; they have {table.column_names}"
        )
    kind = table.schema.field(panes.time).type
    size, slide, _ = panes.ticks(kind)
    ticks = time_ticks(table[panes.time])
    rows, starts = pane_starts(ticks, size, slide)
    columns: dict[str, pa.Array | np.ndarray] = {START: starts}
    picked = pa.array(rows)
    if panes.key is None:
        columns[plan.key] = np.zeros(len(rows), dtype=np.int64)
    else:
        key_type = table.schema.field(panes.key).type
        if not _is_key_type(key_type):
            raise ConfigurationError(
                f"the key column {panes.key!r} is {key_type}: pane keys are integers, "
                "strings or binaries (string, large_string, binary, large_binary); cast it "
                "in PaneMapper.prepare()"
            )
        columns[plan.key] = table[panes.key].take(picked)
    aggregations: list[tuple[str | list[str], str]] = []
    for name, source, function in plan.partials:
        if source is None:
            aggregations.append(([], "count_all"))
            continue
        values = table[source]
        refused = value_type_error(source, values.type, function)
        if refused is not None:
            raise ConfigurationError(refused)
        if values.null_count:
            raise ConfigurationError(
                f"column {source!r} has nulls; the pane aggregates take columns without nulls"
            )
        columns[name] = values.take(picked)
        aggregations.append((name, function))
    names = plan.names
    if plan.rows == ROWS:
        aggregations.append(([], "count_all"))
        names = [*names, ROWS]
    exploded = pa.table(columns)
    grouped = exploded.group_by([START, plan.key], use_threads=False).aggregate(aggregations)
    latest = int(ticks.max()) if len(ticks) else -(2**63)
    return grouped.rename_columns([START, plan.key, *names]), latest, kind


def merge(parts: list[pa.Table], plan: Plan) -> pa.Table:
    """Partials of the same ``(pane start, key)`` merged into one row each (without
    :data:`ROWS`)."""
    table = pa.concat_tables(parts, promote_options="permissive")
    grouped = table.group_by([START, plan.key], use_threads=False).aggregate(
        [(name, _MERGE[function]) for name, _, function in plan.partials]
    )
    return grouped.rename_columns([START, plan.key, *plan.names]).select(
        [START, plan.key, *plan.names]
    )


def finish(
    partials: pa.Table, panes: Panes, plan: Plan, kind: pa.DataType, *, user: bool = True
) -> pa.Table:
    """The aggregates of closed panes: ``window_start, window_end, key, *aggregates``,
    ordered by pane and key, through ``Panes.finish`` when ``user``."""
    size, _, _ = panes.ticks(kind)
    ordered = partials.sort_by([(START, "ascending"), (plan.key, "ascending")])
    starts = ordered[START].combine_chunks()
    ends = pc.add(starts, size)
    if pa.types.is_timestamp(kind):
        starts, ends = starts.cast(kind), ends.cast(kind)
    columns: dict[str, pa.Array | pa.ChunkedArray] = {START: starts, END: ends}
    if panes.key is not None:
        columns[panes.key] = ordered[plan.key]
    for out, (column, function) in panes.aggregates.items():
        if function == "mean":
            # A sum past 2**53 has no exact float64: the mean rounds it, as pyarrow's does.
            total = pc.cast(ordered[plan.name(column, "sum")], pa.float64(), safe=False)
            count = pc.cast(ordered[plan.name(None, "count")], pa.float64())
            columns[out] = pc.divide(total, count)
        elif function == "count":
            columns[out] = pc.cast(ordered[plan.name(None, "count")], pa.int64())
        else:
            columns[out] = ordered[plan.name(column, function)]
    result = pa.table(columns)
    return panes.finish(result) if user and panes.finish is not None else result


def value_type_error(column: str, kind: pa.DataType, function: str) -> str | None:
    """Why the panes cannot aggregate a ``column`` of type ``kind`` with ``function``
    (None: they can, and its partial round-trips through the store exactly).

    Every partial is stored in 8 bytes, bit for bit: integers of any width, float32 and
    float64 (NaN, infinities and -0.0 included), booleans, and for ``min`` and ``max``
    timestamps. Other types would be changed on the way, so they are refused.
    """
    if pa.types.is_integer(kind) or kind in (pa.float32(), pa.float64(), pa.bool_()):
        return None
    if pa.types.is_timestamp(kind):
        if function in ("min", "max"):
            return None
        advice = "aggregate it with min or max, or cast it to int64 ticks in prepare()"
    elif pa.types.is_float16(kind):
        advice = "cast it to float32 in PaneMapper.prepare()"
    elif pa.types.is_decimal(kind):
        advice = (
            "cast it in PaneMapper.prepare() to float64, or to int64 in its smallest unit "
            "(cents, for example) to keep it exact"
        )
    else:
        advice = "cast it to int64 or float64 in PaneMapper.prepare()"
    return (
        f"column {column!r} is {kind}: the pane aggregates cannot store its {function} "
        "exactly (they take integers, float32, float64, booleans, and timestamps for min "
        f"and max): {advice}"
    )


def _bit_width(kind: pa.DataType) -> tuple[str, int]:
    """The integer kind (``"i"``/``"u"``) and byte width holding a partial's bits."""
    if pa.types.is_boolean(kind):
        return "u", 1
    signed = "u" if pa.types.is_unsigned_integer(kind) else "i"
    return signed, kind.bit_width // 8


def encode(table: pa.Table, plan: Plan) -> pa.Array:
    """Each row's partials as one fixed-width binary value (8 bytes per partial), each the
    partial's own bits widened to 64 (signed types sign-extended), so :func:`decode`
    gives back every value exactly, whatever its type.

    Raises:
        ValueError: A partial column has nulls or a type wider than 8 bytes.
    """
    matrix = np.empty((table.num_rows, len(plan.partials)), dtype=np.int64)
    for j, name in enumerate(plan.names):
        column = table[name]
        if column.null_count:
            raise ValueError(f"partial column {name!r} has nulls: partials never do")
        signed, width = _bit_width(column.type)
        values = np.asarray(column.to_numpy(zero_copy_only=False))
        if pa.types.is_boolean(column.type):
            values = values.astype(np.uint8)
        elif values.dtype.itemsize != width or values.dtype.kind not in "iufM":
            raise ValueError(f"partial column {name!r} is {column.type}: it has no 8-byte form")
        matrix[:, j] = values.view(f"{signed}{width}").astype(np.int64)
    width = 8 * len(plan.partials)
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), table.num_rows, [None, pa.py_buffer(matrix.tobytes())]
    )
    return fixed.cast(pa.binary())


def decode(values: list[bytes], schema: pa.Schema, plan: Plan) -> dict[str, pa.Array]:
    """The partial columns of encoded ``values`` (the partial table's ``schema``)."""
    matrix = np.frombuffer(b"".join(values), dtype=np.int64).reshape(
        len(values), len(plan.partials)
    )
    out = {}
    for j, name in enumerate(plan.names):
        kind = schema.field(name).type
        signed, width = _bit_width(kind)
        bits = matrix[:, j].astype(f"{signed}{width}")
        if pa.types.is_boolean(kind):
            out[name] = pa.array(bits.astype(bool), pa.bool_())
        else:
            buffer = pa.py_buffer(np.ascontiguousarray(bits).tobytes())
            out[name] = pa.Array.from_buffers(kind, len(values), [None, buffer])
    return out
