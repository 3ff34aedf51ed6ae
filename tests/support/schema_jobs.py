"""Streams whose schema changes, generated step by step, and a job that shows every row.

A partition is a sequence of steps (a ParquetLog file or a store queue append), each with
its own schema drawn from the changes of :mod:`millstream.schema_unification`: the key
and ``v`` widened along a chain, a nullable ``extra`` column added (and sometimes left
out again), the ``tag`` column dictionary-encoded or plain, the columns in any order. At
most one step of a stream is unsafe: ``v`` narrowed, ``v`` changed to strings, or a
non-null column added. The model here (chains of types, not the module's rule) says what
is safe and what each row adds to the output.

Keys are disjoint per step (partition ``p``, step ``k``: keys ``p*50 + k*6 + i % 6``), so
what a failing step would have committed shows by its keys alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import millstream as ms
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st

V_CHAINS = (
    (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float64()),
    (pa.uint8(), pa.uint16(), pa.uint32(), pa.int64(), pa.float64()),
    (pa.float16(), pa.float32(), pa.float64()),
)
"""Each a chain of types, each holding every value of those before it."""

KEY_CHAINS = ((pa.int8(), pa.int16(), pa.int32(), pa.int64()), (pa.uint8(), pa.int16(), pa.int64()))

MAX_STEPS = 7


@dataclass(frozen=True)
class Step:
    """One file or append: its rows' values and the schema they are written in.

    Attributes:
        keys, values, extras, tags: The rows (``extras``: None where absent).
        schema: The schema written.
        unsafe: Why the step is an unsafe change ("" if it is safe).
        column, before, after: For an unsafe step, the column and the types the error
            must name.
    """

    keys: list[int]
    values: list[int]
    extras: list[str | None]
    tags: list[str]
    schema: pa.Schema
    unsafe: str = ""
    column: str = ""
    before: str = ""
    after: str = ""

    def batch(self) -> pa.RecordBatch:
        """The step's rows in its schema."""
        columns: dict[str, Any] = {
            "key": self.keys,
            "v": [str(v) for v in self.values] if self.unsafe == "string" else self.values,
            "extra": self.extras,
            "tag": self.tags,
            "bad": list(range(len(self.keys))),
        }
        arrays = []
        for field in self.schema:
            values = columns[field.name]
            if pa.types.is_dictionary(field.type):
                arrays.append(pa.array(values, field.type.value_type).dictionary_encode())
            else:
                arrays.append(pa.array(values, field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


@st.composite
def partition_steps(
    draw: st.DrawFn, partition: int, *, dictionaries: bool, unsafe: bool
) -> list[Step]:
    """The steps of one partition; with ``unsafe``, one of them (not the first) is unsafe."""
    v_chain = draw(st.sampled_from(V_CHAINS))
    key_chain = draw(st.sampled_from(KEY_CHAINS))
    count = draw(st.integers(2 if unsafe else 1, MAX_STEPS))
    bad_at = draw(st.integers(1, count - 1)) if unsafe else -1
    v_at = key_at = 0  # the widest type of the chain used so far
    has_extra = False
    steps = []
    for k in range(count):
        n = draw(st.integers(1, 20))
        keys = [partition * 50 + k * 6 + i % 6 for i in range(n)]
        values = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
        v_before = v_at
        v_at = draw(st.integers(v_at, len(v_chain) - 1))
        key_at = draw(st.integers(key_at, len(key_chain) - 1))
        has_extra = has_extra or draw(st.booleans())
        extra_now = has_extra and draw(st.integers(0, 4)) > 0  # sometimes left out again
        extras = draw(st.lists(st.sampled_from(["x", "yy", None]), min_size=n, max_size=n))
        tags = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))
        fields = [pa.field("key", key_chain[key_at]), pa.field("v", v_chain[v_at])]
        tag_type = pa.string()
        if dictionaries and draw(st.booleans()):
            tag_type = pa.dictionary(pa.int32(), pa.string())
        fields.append(pa.field("tag", tag_type))
        if extra_now:
            fields.append(pa.field("extra", pa.string()))
        step = Step(keys, values, extras if extra_now else [None] * n, tags, pa.schema([]))
        if k == bad_at:
            widest = str(v_chain[v_before])  # v's unified type before this step
            kinds = ["string", "non-null"] + (["narrowed"] if v_before > 0 else [])
            kind = draw(st.sampled_from(kinds))
            if kind == "narrowed":
                narrow = v_chain[draw(st.integers(0, v_before - 1))]
                fields[1] = pa.field("v", narrow)
                step = _unsafe(step, "narrowed", "v", widest, str(narrow))
            elif kind == "string":
                fields[1] = pa.field("v", pa.string())
                step = _unsafe(step, "string", "v", widest, "string")
            else:
                fields.append(pa.field("bad", pa.int32(), nullable=False))
                step = _unsafe(step, "non-null", "bad", "(absent)", "int32 not null")
        order = draw(st.permutations(range(len(fields))))
        steps.append(_with_schema(step, pa.schema([fields[i] for i in order])))
    return steps


def _unsafe(step: Step, kind: str, column: str, before: str, after: str) -> Step:
    return Step(
        step.keys, step.values, step.extras, step.tags, step.schema, kind, column, before, after
    )


def _with_schema(step: Step, schema: pa.Schema) -> Step:
    return Step(
        step.keys,
        step.values,
        step.extras,
        step.tags,
        schema,
        step.unsafe,
        step.column,
        step.before,
        step.after,
    )


def expected_output(steps: list[Step]) -> dict[str, dict[Any, int]]:
    """What :class:`EvolvingSumReducer` commits for these (safe) steps' rows."""
    out: dict[str, Counter[Any]] = {name: Counter() for name in ("sum", "rows", "extra", "tag")}
    for step in steps:
        for key, value, extra, tag in zip(
            step.keys, step.values, step.extras, step.tags, strict=True
        ):
            out["sum"][key] += value
            out["rows"][key] += 1
            out["extra"][key] += extra is not None
            out["tag"][tag] += 1
    return {name: {k: n for k, n in counts.items() if n} for name, counts in out.items()}


class EvolvingSumReducer(ms.Reducer):
    """Per key the sum of ``v`` and the rows, the non-null ``extra`` values; per ``tag``
    the rows: whatever schema the rows arrive in (``v`` integer or float, keys of any
    integer type, ``extra`` present or not, ``tag`` plain or dictionary-encoded)."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch])
        table = table.set_column(
            table.schema.get_field_index("v"), "v", pc.cast(table["v"], pa.float64())
        )
        aggregates: list[Any] = [("v", "sum"), ([], "count_all")]
        if "extra" in table.column_names:
            aggregates.append(("extra", "count"))
        per_key = table.group_by("key", use_threads=False).aggregate(aggregates)
        keys = per_key["key"].combine_chunks()
        sums = pc.cast(per_key["v_sum"].combine_chunks(), pa.int64())
        txn.add_many(("sum",), keys, sums)
        txn.add_many(("rows",), keys, per_key["count_all"].combine_chunks())
        if "extra" in table.column_names:
            txn.add_many(("extra",), keys, per_key["extra_count"].combine_chunks())
        tags = table["tag"].combine_chunks()
        if pa.types.is_dictionary(tags.type):
            tags = tags.dictionary_decode()
        per_tag = pa.table({"tag": tags}).group_by("tag").aggregate([([], "count_all")])
        txn.add_many(
            ("tag",), per_tag["tag"].combine_chunks(), per_tag["count_all"].combine_chunks()
        )


__all__ = ["EvolvingSumReducer", "Step", "expected_output", "partition_steps"]
