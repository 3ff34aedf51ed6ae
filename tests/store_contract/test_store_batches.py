"""The store contract for batch operations at their edges, on every backend: empty batches,
empty values, repeated keys, negative deltas, wrap-around at both int64 bounds, counter
lanes over stored values of another width, snapshot batch reads; each checked against a
model built from the per-key rules (:func:`~millstream.state.add_int64s`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from millstream.exceptions import StoreConflictError
from millstream.state import (
    Store,
    add_int64s,
    decode_int64,
    decode_int64s,
    encode_int64,
    encode_int64s,
)
from millstream.state.transaction import SORT_THRESHOLD, StoreTransaction

from tests.support.lanes import add_lanes

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def lane_batch(rows: list[tuple[int, ...]], width: int) -> pa.RecordBatch:
    """``rows`` of ``width`` deltas as int64 columns (one per lane)."""
    return pa.record_batch(
        {f"l{n}": pa.array([row[n] for row in rows], pa.int64()) for n in range(width)}
    )


def test_empty_batches_write_and_read_nothing(store: Store) -> None:
    txn = store.create_transaction()
    none = pa.array([], pa.int64())
    txn.add_many(("c",), none, pa.array([], pa.int64()))
    txn.add_many(("c",), none, lane_batch([], 2))
    txn.set_many(("v",), pa.array([], pa.string()), pa.array([], pa.binary()))
    assert txn.get_many(("v",), none) == []
    assert txn.get_many(("v",), pa.array([], pa.string()), snapshot=True) == []
    txn.commit()
    assert store.transact(lambda t: t.get_range_startswith(())) == []


def test_an_empty_value_is_present_and_empty(store: Store) -> None:
    keys = pa.array(["a", "b"])
    store.transact(lambda t: t.set_many(("v",), keys, pa.array([b"", b"x"], pa.binary())))
    assert store.transact(lambda t: t.get_many(("v",), pa.array(["a", "b", "c"]))) == [
        b"",
        b"x",
        None,
    ]
    assert store.transact(lambda t: t.get(("v", "a"))) == b""


def test_batch_adds_wrap_around_at_both_int64_bounds(store: Store) -> None:
    keys = pa.array([1, 2], pa.int64())
    bounds = pa.array([encode_int64(INT64_MIN), encode_int64(INT64_MAX)], pa.binary())
    store.transact(lambda t: t.set_many(("one",), keys, bounds))
    store.transact(lambda t: t.add_many(("one",), keys, pa.array([-1, 1], pa.int64())))
    got = store.transact(lambda t: t.get_many(("one",), keys))
    assert [decode_int64(v or b"") for v in got] == [INT64_MAX, INT64_MIN]

    stored = lane_batch([(INT64_MIN, INT64_MAX)] * 2, 2)
    store.transact(lambda t: t.add_many(("two",), keys, stored))
    # Key 1 steps over both bounds; key 2 repeats, its deltas folded across a bound first.
    deltas = lane_batch([(-1, 1), (INT64_MAX, INT64_MAX), (INT64_MAX, 2)], 2)
    store.transact(lambda t: t.add_many(("two",), pa.array([1, 2, 2], pa.int64()), deltas))
    got = store.transact(lambda t: t.get_many(("two",), keys))
    assert [decode_int64s(v, 2) for v in got] == [(INT64_MAX, INT64_MIN), (INT64_MAX - 1, 0)]


def test_counter_lanes_of_a_large_batch_fold_repeated_keys(store: Store) -> None:
    """Past :data:`SORT_THRESHOLD` rows the batch is written in key order: repeated keys,
    negative deltas and stored values of other widths give what the per-key rules give."""
    rng = np.random.default_rng(48)
    n = 4 * SORT_THRESHOLD
    keys = rng.integers(-300, 400, n)
    lanes = rng.integers(INT64_MIN, INT64_MAX, (n, 2), dtype=np.int64, endpoint=True)
    stored = {-5: encode_int64(7), 3: encode_int64s([1, 2, 3]), 11: b"\x01\x02\x03"}
    store.transact(lambda t: [t.set(("c", k), v) for k, v in stored.items()])
    batch = lane_batch([tuple(row) for row in lanes.tolist()], 2)
    store.transact(lambda t: t.add_many(("c",), pa.array(keys), batch))
    model: dict[int, bytes | None] = dict(stored)
    for key, row in zip(keys.tolist(), lanes.tolist(), strict=True):
        model[key] = add_lanes(store, model.get(key), row)
    rows = store.transact(lambda t: t.get_range_startswith(("c",)))
    assert {k[-1]: v for k, v in rows} == model


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    width=st.integers(min_value=1, max_value=3),
    stored=st.dictionaries(st.integers(0, 5), st.binary(max_size=30), max_size=4),
)
def test_batch_adds_match_the_per_key_rules(
    store: Store, data: st.DataObject, width: int, stored: dict[int, bytes]
) -> None:
    """Any keys (repeated or not), any deltas (the bounds, negatives), over stored values
    of any width: one counter by atomic add, several as lanes."""
    delta = st.sampled_from([INT64_MIN, INT64_MAX, -1, 0, 1]) | st.integers(INT64_MIN, INT64_MAX)
    rows = data.draw(
        st.lists(st.tuples(st.integers(0, 7), st.tuples(*[delta] * width)), max_size=30)
    )
    space = ("prop", uuid.uuid4().hex)
    store.transact(lambda t: [t.set((*space, k), v) for k, v in stored.items()])
    keys = pa.array([k for k, _ in rows], pa.int64())
    deltas = lane_batch([d for _, d in rows], width)
    store.transact(lambda t: t.add_many(space, keys, deltas if width > 1 else deltas.column(0)))
    model: dict[int, bytes | None] = dict(stored)
    for key, lanes in rows:
        if width == 1:
            model[key] = add_int64s(model.get(key), encode_int64s(lanes))
        else:
            model[key] = add_lanes(store, model.get(key), lanes)
    everything = pa.array(range(8), pa.int64())
    assert store.transact(lambda t: t.get_many(space, everything)) == [
        model.get(k) for k in range(8)
    ]


BATCH_READS: dict[str, Callable[[StoreTransaction, bool], list[bytes | None]]] = {
    "get_many": lambda txn, snapshot: txn.get_many(
        ("k",), pa.array(["a", "b", "c"]), snapshot=snapshot
    ),
    "get_each": lambda txn, snapshot: txn.get_each(
        [("k", "a"), ("k", "b"), ("k", "c")], snapshot=snapshot
    ),
    # More keys than a local store reads one by one (SQLite: one IN query).
    "get_each-many": lambda txn, snapshot: txn.get_each(
        [("k", "a"), ("k", "b"), ("k", "c"), ("k", "d"), ("k", "e"), ("k", "f")],
        snapshot=snapshot,
    )[:3],
}


@pytest.mark.parametrize("read", sorted(BATCH_READS))
@pytest.mark.parametrize("snapshot", [False, True], ids=["read", "snapshot"])
def test_a_batch_read_conflicts_unless_it_is_a_snapshot(
    store: Store, snapshot: bool, read: str
) -> None:
    keys = pa.array(["a", "b", "c"])
    store.transact(lambda t: t.set_many(("k",), keys, pa.array([b"0"] * 3, pa.binary())))
    a = store.create_transaction()
    assert BATCH_READS[read](a, snapshot) == [b"0"] * 3
    store.transact(lambda t: t.set(("k", "b"), b"1"))
    a.set(("elsewhere",), b"a")
    if snapshot:
        a.commit()
    else:
        with pytest.raises(StoreConflictError):
            a.commit()


def test_unrelated_keys_read_together_see_the_transactions_own_writes(store: Store) -> None:
    store.transact(lambda t: [t.set(("q", 0, "end"), b"7"), t.set(("q", 0, "p", "x"), b"r")])
    txn = store.create_transaction()
    txn.set(("q", 0, "schema"), b"s")
    txn.clear(("q", 0, "end"))
    keys = [("q", 0, "sealed"), ("q", 0, "schema"), ("q", 0, "end"), ("q", 0, "p", "x")]
    assert txn.get_each(keys) == [None, b"s", None, b"r"]
    # As many keys as a local store reads in one query.
    more = [*keys, ("q", 1, "end"), ("q", 0, "schema"), ("q", 0, "p", "x")]
    assert txn.get_each(more) == [None, b"s", None, b"r", None, b"s", b"r"]
    assert txn.get_each([]) == []
    txn.commit()
    assert store.transact(lambda t: t.get_each(keys, snapshot=True)) == [None, b"s", None, b"r"]
