"""Tuple-layer key encoding: the fast batch encoders agree with fdb.tuple."""

from __future__ import annotations

import fdb.tuple
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from millstream.state.keys import (
    add_int64s,
    decode_int64,
    decode_int64s,
    encode_int64,
    encode_int64s,
    encode_keys,
    pack,
    range_of,
    strinc,
    unpack,
    wrap_int64,
)

BASE = pack(("p", "space"))


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1)))
def test_int64_batch_encoding_matches_fdb(values: list[int]) -> None:
    encoded = encode_keys(BASE, pa.array(values, pa.int64()))
    assert encoded == [fdb.tuple.pack(("p", "space", v)) for v in values]


@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1)))
def test_uint64_batch_encoding_matches_fdb(values: list[int]) -> None:
    encoded = encode_keys(BASE, pa.array(values, pa.uint64()))
    assert encoded == [fdb.tuple.pack(("p", "space", v)) for v in values]


@given(st.lists(st.text()))
def test_string_batch_encoding_matches_fdb(values: list[str]) -> None:
    assert encode_keys(BASE, pa.array(values, pa.string())) == [
        fdb.tuple.pack(("p", "space", v)) for v in values
    ]


@given(st.lists(st.binary()))
def test_binary_batch_encoding_matches_fdb(values: list[bytes]) -> None:
    assert encode_keys(BASE, pa.array(values, pa.binary())) == [
        fdb.tuple.pack(("p", "space", v)) for v in values
    ]


@given(
    st.tuples(
        st.integers(), st.text(), st.binary(), st.none(), st.booleans(), st.floats(allow_nan=False)
    )
)
def test_pack_round_trips(key: tuple[object, ...]) -> None:
    assert unpack(pack(key)) == key


_ELEMENTS = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.text()
    | st.binary()
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False)
)


@given(st.lists(_ELEMENTS | st.tuples(_ELEMENTS), max_size=6).map(tuple))
def test_pack_matches_fdb(key: tuple[object, ...]) -> None:
    """The fast path (ints, strings, bytes) and the fallback give fdb.tuple's bytes."""
    assert pack(key) == fdb.tuple.pack(key)


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_int64_values_wrap_like_fdb_add(value: int) -> None:
    wrapped = wrap_int64(value)
    assert -(2**63) <= wrapped < 2**63
    assert (wrapped - value) % 2**64 == 0
    assert decode_int64(encode_int64(wrapped)) == wrapped


def test_short_and_long_values_decode_like_fdb_add() -> None:
    assert decode_int64(b"\x01") == 1
    assert decode_int64(b"") == 0
    assert decode_int64(encode_int64(-5) + b"extra") == -5


int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(st.lists(st.tuples(int64s, int64s), min_size=1, max_size=6), st.booleans())
def test_counter_lanes_add_each_lane_like_fdb_add(
    pairs: list[tuple[int, int]], absent: bool
) -> None:
    base = None if absent else encode_int64s([b for b, _ in pairs])
    total = add_int64s(base, encode_int64s([d for _, d in pairs]))
    expected = [wrap_int64((0 if absent else b) + d) for b, d in pairs]
    assert decode_int64s(total, len(pairs)) == tuple(expected)
    # A lane is exactly one atomic-add value.
    assert [total[8 * i : 8 * i + 8] for i in range(len(pairs))] == [
        encode_int64(e) for e in expected
    ]


def test_counter_lanes_of_another_width_are_cut_or_zero_extended() -> None:
    assert add_int64s(encode_int64s([1, 2, 3]), encode_int64s([10, 10])) == encode_int64s([11, 12])
    assert add_int64s(encode_int64(5), encode_int64s([1, 1])) == encode_int64s([6, 1])
    assert decode_int64s(encode_int64s([7, 8]), 3) == (7, 8, 0)
    assert decode_int64s(None, 2) == (0, 0)


def test_ranges() -> None:
    begin, end = range_of(("a",))
    assert begin < pack(("a", "zzz")) < pack(("a", 0)) < end
    assert not begin <= pack(("a",)) < end
    assert strinc(b"ab\xff\xff") == b"ac"
