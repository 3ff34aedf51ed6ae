"""The unification rule: the order of types it defines, what it refuses, and casts that
keep every value."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from millstream.exceptions import SchemaEvolutionError
from millstream.schema_unification import (
    common_type,
    concat,
    conform,
    evolve,
    unify,
    widens_to,
)

TYPES = [
    pa.null(),
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
    pa.string(),
    pa.large_string(),
    pa.binary(),
    pa.large_binary(),
    pa.bool_(),
    pa.timestamp("ms"),
]
KINDS = st.sampled_from(TYPES)


@given(a=KINDS, b=KINDS)
def test_the_common_type_holds_both_and_is_the_least(a: pa.DataType, b: pa.DataType) -> None:
    join = common_type(a, b)
    assert join == common_type(b, a)
    if join is None:
        assert not widens_to(a, b)
        assert not widens_to(b, a)
        return
    assert widens_to(a, join)
    assert widens_to(b, join)
    for c in TYPES:
        if widens_to(a, c) and widens_to(b, c):
            assert widens_to(join, c), f"{join} is not below {c}, which holds {a} and {b}"


def test_widening_is_a_partial_order() -> None:
    for a in TYPES:
        assert widens_to(a, a)
    for a, b in itertools.permutations(TYPES, 2):
        if widens_to(a, b):
            assert not widens_to(b, a), f"{a} and {b} widen to each other"
    for a, b, c in itertools.permutations(TYPES, 3):
        if widens_to(a, b) and widens_to(b, c):
            assert widens_to(a, c)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (pa.int8(), pa.int64()),
        (pa.uint8(), pa.uint64()),
        (pa.uint32(), pa.int64()),
        (pa.float16(), pa.float64()),
        (pa.int32(), pa.float64()),
        (pa.int64(), pa.float64()),
        (pa.string(), pa.large_string()),
        (pa.null(), pa.string()),
    ],
)
def test_the_widenings_the_docs_name(old: pa.DataType, new: pa.DataType) -> None:
    assert widens_to(old, new)
    assert not widens_to(new, old)


def test_integer_pairs_without_a_common_integer() -> None:
    assert common_type(pa.int64(), pa.uint64()) is None
    assert common_type(pa.int32(), pa.uint32()) == pa.int64()
    assert common_type(pa.int64(), pa.string()) is None


def _values(kind: pa.DataType) -> st.SearchStrategy[object]:
    if pa.types.is_signed_integer(kind):
        bits = kind.bit_width
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if pa.types.is_unsigned_integer(kind):
        return st.integers(0, 2**kind.bit_width - 1)
    return st.integers(-2048, 2048)  # every float type holds these


NUMBERS = [t for t in TYPES if pa.types.is_integer(t) or pa.types.is_floating(t)]


@settings(max_examples=60)
@given(data=st.data(), a=st.sampled_from(NUMBERS), b=st.sampled_from(NUMBERS))
def test_conform_keeps_every_value(data: st.DataObject, a: pa.DataType, b: pa.DataType) -> None:
    join = common_type(a, b)
    if join is None:
        return
    values = data.draw(st.lists(_values(a), max_size=20))
    if join == pa.float64():  # the values float64 holds exactly
        values = [v for v in values if abs(int(v)) <= 2**53]  # type: ignore[call-overload]
    batch = pa.record_batch({"x": pa.array(values, a)})
    out = conform(batch, pa.schema([("x", join)]))
    assert out.schema.field("x").type == join
    assert [float(v) for v in out.column("x").to_pylist()] == [float(v) for v in values]  # type: ignore[arg-type]


def test_an_integer_float64_cannot_hold_is_an_error_naming_the_column() -> None:
    batch = pa.record_batch({"x": pa.array([2**53 + 1])})
    with pytest.raises(SchemaEvolutionError, match="column 'x' changed from int64 to double"):
        conform(batch, pa.schema([("x", pa.float64())]))


def test_safe_changes_unify_in_the_first_order() -> None:
    first = pa.schema([pa.field("a", pa.int32(), False), ("s", pa.string())])
    later = pa.schema(
        [("s", pa.dictionary(pa.int8(), pa.string())), ("b", pa.float32()), ("a", pa.int64())]
    )
    unified = evolve(first, later)
    assert unified == pa.schema([("a", pa.int64()), ("s", pa.string()), ("b", pa.float32())])
    rows = concat(
        [
            pa.record_batch({"a": pa.array([1], pa.int32()), "s": ["x"]}, schema=first),
            pa.record_batch(
                [pa.array(["y"]).dictionary_encode(), pa.array([0.5], pa.float32()), [2]],
                schema=later,
            ),
        ]
    )
    assert rows.schema == unified
    assert rows.to_pylist() == [{"a": 1, "s": "x", "b": None}, {"a": 2, "s": "y", "b": 0.5}]


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        (
            pa.schema([("v", pa.int64())]),
            pa.schema([("v", pa.int32())]),
            "int64 to int32: the type narrowed",
        ),
        (
            pa.schema([("v", pa.int64())]),
            pa.schema([("v", pa.string())]),
            "int64 to string: the new type",
        ),
        (
            pa.schema([("v", pa.int64())]),
            pa.schema([("v", pa.int64()), pa.field("w", pa.int8(), False)]),
            "column 'w' changed from (absent) to int8 not null",
        ),
        (pa.schema([("v", pa.int32())]), pa.schema([("v", pa.uint32())]), "int32 to uint32"),
        (
            pa.schema([("v", pa.int32())]),
            pa.schema([("w", pa.int32())]),
            "shares no column with the earlier rows' (v)",
        ),
    ],
    ids=["narrowed", "incompatible", "non-null added", "sign changed", "another stream"],
)
def test_unsafe_changes_name_the_column_and_both_types(
    before: pa.Schema, after: pa.Schema, message: str
) -> None:
    with pytest.raises(SchemaEvolutionError) as caught:
        evolve(before, after)
    assert message in str(caught.value)


def test_across_streams_a_narrower_schema_unifies() -> None:
    wide = pa.schema([("v", pa.int64())])
    narrow = pa.schema([("v", pa.int8())])
    assert unify(wide, narrow) == wide
    with pytest.raises(SchemaEvolutionError, match="column 'v' changed from int64 to string"):
        unify(wide, pa.schema([("v", pa.string())]))
