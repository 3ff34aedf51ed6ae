"""The state store contract: operations, ordering, read-your-writes, conflicts, limits."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from millstream.exceptions import (
    CommitUnknownResultError,
    KeyTooLargeError,
    StoreConflictError,
    TransactionTooLargeError,
    TransactionTooOldError,
    ValueTooLargeError,
)
from millstream.state import (
    Store,
    StoreLimits,
    StoreTransaction,
    decode_int64,
    decode_int64s,
    encode_int64,
    open_store,
    pack,
)
from millstream.state.keys import int64_lanes
from millstream.state.replay import ReplayingTransaction

StoreFactory = Callable[..., Store]

INT64_MAX = 2**63 - 1


def test_get_set_clear(store: Store) -> None:
    def write(txn: StoreTransaction) -> None:
        txn.set(("a",), b"1")
        txn.set(("b", 2), b"")
        txn.set(("c",), b"3")

    store.transact(write)
    assert store.transact(lambda t: t.get(("a",))) == b"1"
    assert store.transact(lambda t: t.get(("b", 2))) == b""
    assert store.transact(lambda t: t.get(("missing",))) is None
    store.transact(lambda t: t.clear(("a",)))
    store.transact(lambda t: t.clear(("never-there",)))
    assert store.transact(lambda t: t.get(("a",))) is None
    assert store.transact(lambda t: t.get(("c",))) == b"3"


def test_uncommitted_writes_are_invisible(store: Store) -> None:
    txn = store.create_transaction()
    txn.set(("k",), b"v")
    txn.reset()
    assert store.transact(lambda t: t.get(("k",))) is None
    other = store.create_transaction()
    other.set(("k",), b"v")
    assert store.transact(lambda t: t.get(("k",))) is None
    other.commit()
    assert store.transact(lambda t: t.get(("k",))) == b"v"


def test_a_read_block_sees_commits_and_drops_its_writes(store: Store) -> None:
    store.transact(lambda t: t.set(("k",), b"1"))
    with store.read() as txn:
        assert txn.get(("k",)) == b"1"
        txn.set(("k",), b"2")

    def write_then_fail() -> None:
        with store.read() as txn:
            txn.set(("j",), b"x")
            raise RuntimeError("in the block")

    with pytest.raises(RuntimeError, match="in the block"):
        write_then_fail()
    assert store.transact(lambda t: (t.get(("k",)), t.get(("j",)))) == (b"1", None)
    # Nothing is left open: a writer commits and the next read block sees it.
    store.transact(lambda t: t.set(("k",), b"3"))
    with store.read() as txn:
        assert txn.get(("k",)) == b"3"


def test_get_range_order_limit_reverse(store: Store) -> None:
    def write(txn: StoreTransaction) -> None:
        for i in (5, -3, 0, 1000, 2):
            txn.set(("r", i), str(i).encode())
        txn.set(("r",), b"parent")
        txn.set(("s", 0), b"other")

    store.transact(write)
    rows = store.transact(lambda t: t.get_range(("r", -10), ("r", 10**6)))
    assert [k for k, _ in rows] == [("r", -3), ("r", 0), ("r", 2), ("r", 5), ("r", 1000)]
    assert [v for _, v in rows] == [b"-3", b"0", b"2", b"5", b"1000"]
    assert [k for k, _ in store.transact(lambda t: t.get_range(("r", 0), ("r", 5)))] == [
        ("r", 0),
        ("r", 2),
    ]
    first_two = store.transact(lambda t: t.get_range(("r", -10), ("r", 10**6), limit=2))
    assert [k for k, _ in first_two] == [("r", -3), ("r", 0)]
    last_two = store.transact(lambda t: t.get_range(("r", -10), ("r", 10**6), 2, True))
    assert [k for k, _ in last_two] == [("r", 1000), ("r", 5)]
    children = store.transact(lambda t: t.get_range_startswith(("r",)))
    assert len(children) == 5
    assert ("r",) not in [k for k, _ in children]
    assert store.transact(lambda t: t.get_range(("r", 5), ("r", 5))) == []
    assert store.transact(lambda t: t.get_range(("r", 9), ("r", 1))) == []


def test_clear_range(store: Store) -> None:
    store.transact(lambda t: [t.set(("x", i), b"v") for i in range(10)])
    store.transact(lambda t: t.clear_range(("x", 3), ("x", 7)))
    keys = [k[1] for k, _ in store.transact(lambda t: t.get_range_startswith(("x",)))]
    assert keys == [0, 1, 2, 7, 8, 9]
    store.transact(lambda t: t.clear_range_startswith(("x",)))
    assert store.transact(lambda t: t.get_range_startswith(("x",))) == []


def test_atomic_add(store: Store) -> None:
    store.transact(lambda t: t.add(("n",), 5))
    store.transact(lambda t: t.add(("n",), -7))
    assert decode_int64(store.transact(lambda t: t.get(("n",))) or b"") == -2
    store.transact(lambda t: t.set(("m",), encode_int64(INT64_MAX)))
    store.transact(lambda t: t.add(("m",), 1))
    assert decode_int64(store.transact(lambda t: t.get(("m",))) or b"") == -(2**63)
    store.transact(lambda t: t.set(("short",), b"\x01"))
    store.transact(lambda t: t.add(("short",), 1))
    assert store.transact(lambda t: t.get(("short",))) == encode_int64(2)


def test_read_your_writes(store: Store) -> None:
    store.transact(lambda t: [t.set(("w", i), b"old") for i in range(6)])
    txn = store.create_transaction()
    txn.set(("w", 1), b"new")
    txn.clear(("w", 2))
    txn.clear_range(("w", 4), ("w", 6))
    txn.set(("w", 5), b"again")
    txn.set(("w", 9), b"fresh")
    txn.add(("w", 3), 1)
    txn.add(("sum",), 2)
    txn.add(("sum",), 3)
    assert txn.get(("w", 1)) == b"new"
    assert txn.get(("w", 2)) is None
    assert txn.get(("w", 4)) is None
    assert decode_int64(txn.get(("sum",)) or b"") == 5
    expected = [
        (("w", 0), b"old"),
        (("w", 1), b"new"),
        (("w", 3), encode_int64(decode_int64(b"old") + 1)),
        (("w", 5), b"again"),
        (("w", 9), b"fresh"),
    ]
    assert txn.get_range_startswith(("w",)) == expected
    assert txn.get_range_startswith(("w",), limit=2, reverse=True) == expected[::-1][:2]
    txn.commit()
    assert store.transact(lambda t: t.get_range_startswith(("w",))) == expected


@pytest.mark.parametrize(
    "keys",
    [
        pa.array([3, -1, 2**40, 0, 7], pa.int64()),
        pa.array(["b", "a", "", "zeta\x00nul", "ü"]),
        pa.array([b"\x00", b"b", b"", b"\xff\x00", b"a"], pa.binary()),
        pa.array([5, 1, 2, 3, 4], pa.int32()),
    ],
    ids=["int64", "string", "binary", "int32"],
)
def test_batch_operations_match_per_key_operations(store: Store, keys: pa.Array) -> None:
    deltas = pa.array([1, 2, 3, 4, 5], pa.int64())
    values = pa.array([b"v%d" % i for i in range(5)], pa.binary())
    store.transact(lambda t: t.add_many(("sum",), keys, deltas))
    store.transact(lambda t: t.add_many(("sum",), keys, deltas))
    store.transact(lambda t: t.set_many(("val",), keys, values))
    for i, key in enumerate(keys.to_pylist()):
        assert store.transact(lambda t, k=key: t.get(("sum", k))) == encode_int64(2 * (i + 1))
        assert store.transact(lambda t, k=key: t.get(("val", k))) == b"v%d" % i
    got = store.transact(lambda t: t.get_many(("val",), keys))
    assert got == values.to_pylist()
    absent = store.transact(lambda t: t.get_many(("nothing",), keys))
    assert absent == [None] * 5


def test_batch_add_with_duplicates_and_many_keys(store: Store) -> None:
    n = 5000
    keys = pa.array([i % 1000 for i in range(n)], pa.int64())
    deltas = pa.array([1] * n, pa.int64())
    store.transact(lambda t: t.add_many(("c",), keys, deltas))
    txn = store.create_transaction()
    txn.add_many(("c",), pa.array([0, 1]), pa.array([10, 20]))
    assert [decode_int64(v or b"") for v in txn.get_many(("c",), pa.array([0, 1, 2]))] == [
        15,
        25,
        5,
    ]
    txn.commit()
    rows = store.transact(lambda t: t.get_range_startswith(("c",)))
    assert len(rows) == 1000
    assert sum(decode_int64(v) for _, v in rows) == n + 30


def counters(t: StoreTransaction, keyspace: tuple[object, ...], keys: list[int], width: int):
    """The lanes at ``keyspace + (k,)`` for each of ``keys``, read in ``t``."""
    values = t.get_many(keyspace, pa.array(keys, pa.int64()))
    return [decode_int64s(v, width) for v in values]


def test_several_counters_per_key_are_one_value_added_lane_by_lane(store: Store) -> None:
    keys = pa.array([4, 1, 4, 2**40, -3], pa.int64())
    deltas = pa.record_batch(
        {
            "max": pa.array([INT64_MAX, 0, 1, -1, 0], pa.int64()),
            "sum": pa.array([10, 20, 30, 40, -50], pa.int64()),
            "count": pa.array([1, 1, 1, 1, 1], pa.int32()),
        }
    )
    store.transact(lambda t: t.add_many(("c",), keys, deltas))
    # Each lane wraps around on its own: no carry crosses into the next lane.
    got = store.transact(lambda t: counters(t, ("c",), [4, 1, 2**40, -3], 3))
    assert got == [(-(2**63), 40, 2), (0, 20, 1), (-1, 40, 1), (0, -50, 1)]
    store.transact(lambda t: t.add_many(("c",), keys, pa.Table.from_batches([deltas])))
    got = store.transact(lambda t: counters(t, ("c",), [4, 1, 2**40, -3], 3))
    assert got == [(0, 80, 4), (0, 40, 2), (-2, 80, 2), (0, -100, 2)]
    rows = store.transact(lambda t: t.get_range_startswith(("c",)))
    assert len(rows) == 4
    assert all(int64_lanes(v) == 3 for _, v in rows)
    assert decode_int64s(rows[0][1], 3) == (0, -100, 2)
    # One column is the one-counter form: the same value as add_many of an array.
    store.transact(lambda t: t.add_many(("one",), keys, pa.record_batch({"n": keys})))
    store.transact(lambda t: t.add_many(("array",), keys, keys))
    one = store.transact(lambda t: t.get_range_startswith(("one",)))
    array = store.transact(lambda t: t.get_range_startswith(("array",)))
    assert [v for _, v in one] == [v for _, v in array]


def test_counter_lanes_read_their_own_writes(store: Store) -> None:
    before = pa.record_batch({"a": pa.array([1, 100]), "b": pa.array([2, 100])})
    store.transact(lambda t: t.add_many(("c",), pa.array([1, 3]), before))
    txn = store.create_transaction()
    lanes = pa.record_batch({"a": pa.array([5, 5, 5]), "b": pa.array([-1, -1, -1])})
    txn.add_many(("c",), pa.array([1, 2, 1]), lanes)
    txn.add(("c", 2), 7)  # an int add works on the first lane and cuts the value to it
    txn.clear(("c", 3))
    txn.add_many(("c",), pa.array([2, 3]), lanes.slice(0, 2))
    expected = [(11, 0), (17, -1), (5, -1)]
    assert counters(txn, ("c",), [1, 2, 3], 2) == expected
    assert [decode_int64s(v, 2) for _, v in txn.get_range_startswith(("c",))] == expected
    txn.commit()
    assert store.transact(lambda t: counters(t, ("c",), [1, 2, 3], 2)) == expected


def test_counter_lanes_of_another_width_are_cut_or_extended(store: Store) -> None:
    store.transact(lambda t: t.add(("c", 1), 9))
    three = pa.record_batch({"a": pa.array([1]), "b": pa.array([2]), "c": pa.array([3])})
    store.transact(lambda t: t.add_many(("c",), pa.array([2]), three))
    lanes = pa.record_batch({"a": pa.array([1, 1]), "b": pa.array([1, 1])})
    store.transact(lambda t: t.add_many(("c",), pa.array([1, 2]), lanes))
    assert store.transact(lambda t: counters(t, ("c",), [1, 2], 3)) == [(10, 1, 0), (2, 3, 0)]
    assert decode_int64s(None, 2) == (0, 0)


def test_counter_lanes_are_checked(store: Store) -> None:
    txn = store.create_transaction()
    with pytest.raises(ValueError, match="without columns"):
        txn.add_many(("c",), pa.array([1]), pa.record_batch({}))
    with pytest.raises(TypeError, match="must be integers"):
        txn.add_many(("c",), pa.array([1]), pa.record_batch({"f": pa.array([1.5])}))
    with pytest.raises(ValueError, match="2 keys but 1 deltas"):
        txn.add_many(("c",), pa.array([1, 2]), pa.record_batch({"n": pa.array([1])}))
    wide = pa.record_batch({f"c{i}": pa.array([1]) for i in range(20_000)})
    with pytest.raises(ValueTooLargeError):
        txn.add_many(("c",), pa.array([1]), wide)
    txn.reset()


def test_write_size_accounts_for_writes(store: Store) -> None:
    txn = store.create_transaction()
    assert txn.write_size == 0
    txn.set(("k",), b"x" * 1000)
    assert txn.write_size > 1000
    before = txn.write_size
    txn.add_many(("a",), pa.array(range(100)), pa.array([1] * 100))
    assert txn.write_size > before + 800
    txn.reset()


key_elements = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=20),
    st.binary(max_size=20),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keys=st.lists(
        st.tuples(key_elements, key_elements) | st.tuples(key_elements), min_size=1, max_size=20
    )
)
def test_tuple_keys_round_trip_in_byte_order(store: Store, keys: list[tuple[object, ...]]) -> None:
    space = ("prop", uuid.uuid4().hex)

    def write(txn: StoreTransaction) -> None:
        for i, key in enumerate(keys):
            txn.set((*space, *key), str(i).encode())

    store.transact(write)
    rows = store.transact(lambda t: t.get_range_startswith(space))
    unique = {pack(k): k for k in keys}
    assert [k[len(space) :] for k, _ in rows] == [unique[p] for p in sorted(unique)]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1))
def test_integer_keys_sort_numerically(store: Store, values: list[int]) -> None:
    space = ("ints", uuid.uuid4().hex)
    store.transact(
        lambda t: t.set_many(
            space, pa.array(values, pa.int64()), pa.array([b""] * len(values), pa.binary())
        )
    )
    rows = store.transact(lambda t: t.get_range_startswith(space))
    assert [k[-1] for k, _ in rows] == sorted(set(values))


# -- concurrency ------------------------------------------------------------------------


def test_read_write_conflict(store: Store) -> None:
    store.transact(lambda t: t.set(("k",), b"0"))
    a = store.create_transaction()
    assert a.get(("k",)) == b"0"
    store.transact(lambda t: t.set(("k",), b"1"))
    a.set(("k",), b"from a")
    with pytest.raises(StoreConflictError):
        a.commit()
    assert store.transact(lambda t: t.get(("k",))) == b"1"


def test_range_read_conflicts_with_insert(store: Store) -> None:
    a = store.create_transaction()
    assert a.get_range_startswith(("q",)) == []
    store.transact(lambda t: t.set(("q", 1), b"phantom"))
    a.set(("r",), b"x")
    with pytest.raises(StoreConflictError):
        a.commit()


def test_disjoint_keys_snapshot_reads_and_adds_do_not_conflict(store: Store) -> None:
    store.transact(lambda t: [t.set(("k", i), b"0") for i in range(3)])
    a = store.create_transaction()
    b = store.create_transaction()
    a.get(("k", 0))
    b.get(("k", 1))
    a.get(("k", 2), snapshot=True)
    a.set(("k", 0), b"a")
    b.set(("k", 1), b"b")
    a.add(("total",), 1)
    b.add(("total",), 2)
    b.set(("k", 2), b"b")
    b.commit()
    a.commit()
    assert store.transact(lambda t: t.get(("total",))) == encode_int64(3)


def test_read_only_transaction_commits_despite_later_writes(store: Store) -> None:
    a = store.create_transaction()
    a.get(("k",))
    store.transact(lambda t: t.set(("k",), b"1"))
    a.commit()


def test_transact_retries_conflicts_and_unknown_results_of_idempotent_bodies(
    store: Store,
) -> None:
    attempts: list[int] = []

    def fn(txn: StoreTransaction) -> str:
        attempts.append(len(attempts))
        value = txn.get(("c",))
        if len(attempts) == 1:
            store.transact(lambda t: t.set(("c",), b"interloper"))
        if len(attempts) == 2:
            raise CommitUnknownResultError("simulated 1021")
        if value is not None and value.endswith(b"+"):
            return "done"  # what an idempotent body does: check whether its work is done
        txn.set(("c",), (value or b"") + b"+")
        return "done"

    assert store.transact(fn, idempotent=True) == "done"
    assert len(attempts) == 3
    assert store.transact(lambda t: t.get(("c",))) == b"interloper+"


def test_transact_does_not_rerun_other_bodies_after_an_unknown_result(store: Store) -> None:
    attempts: list[None] = []

    def fn(txn: StoreTransaction) -> None:
        attempts.append(None)
        txn.add(("n",), 1)
        raise CommitUnknownResultError("simulated 1021")

    with pytest.raises(CommitUnknownResultError, match=r"not declared idempotent.*idempotent=True"):
        store.transact(fn)
    assert len(attempts) == 1


def test_transact_gives_up_after_max_retries(store: Store) -> None:
    calls: list[None] = []

    def always_conflicts(txn: StoreTransaction) -> None:
        calls.append(None)
        raise StoreConflictError("always")

    with pytest.raises(StoreConflictError):
        store.transact(always_conflicts, max_retries=2)
    assert len(calls) == 3


def test_threads_share_a_store(store: Store) -> None:
    per_thread = 30

    def increment(txn: StoreTransaction) -> None:
        raw = txn.get(("counter",))
        txn.set(("counter",), encode_int64(decode_int64(raw or encode_int64(0)) + 1))

    def work() -> None:
        for _ in range(per_thread):
            store.transact(increment, max_retries=None)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.transact(lambda t: t.get(("counter",))) == encode_int64(4 * per_thread)


# -- limits -----------------------------------------------------------------------------


def test_key_and_value_limits(store: Store) -> None:
    txn = store.create_transaction()
    with pytest.raises(KeyTooLargeError, match="10000-byte key limit"):
        txn.set(("k", "x" * 10_001), b"")
    with pytest.raises(ValueTooLargeError, match="100000-byte value limit"):
        txn.set(("k",), b"x" * 100_001)
    with pytest.raises(ValueTooLargeError, match="value of 100001 bytes"):
        txn.set_many(("k",), pa.array([1, 2]), pa.array([b"", b"x" * 100_001], pa.binary()))
    with pytest.raises(KeyTooLargeError):
        txn.add_many(("k",), pa.array(["y" * 10_001]), pa.array([1]))
    txn.set(("k",), b"x" * 100_000)
    txn.commit()


def test_transaction_size_limit(make_store: StoreFactory) -> None:
    store = make_store(StoreLimits(max_transaction_bytes=50_000))
    txn = store.create_transaction()
    for i in range(40):
        txn.set(("k", i), b"x" * 1000)
    with pytest.raises(TransactionTooLargeError, match="Commit more often"):
        txn.set(("k", 41), b"x" * 10_000)
    txn.reset()
    store.transact(lambda t: t.set(("k",), b"x" * 1000))


def test_default_transaction_size_limit_is_ten_megabytes(store: Store) -> None:
    txn = store.create_transaction()
    # Each set counts its value, three times its key and 69 bytes (FoundationDB's count).
    for i in range(110):
        txn.set(("big", i), b"x" * 90_000)
    with pytest.raises(TransactionTooLargeError, match="10000000-byte transaction limit"):
        txn.set(("big", 111), b"x" * 90_000)
    txn.reset()


def test_a_splittable_transaction_is_held_to_what_its_backend_takes(
    make_store: StoreFactory,
) -> None:
    """A transaction whose caller splits its work when it is too large (a reducer's commit
    of several rows) may pass FoundationDB's count on a backend without a size limit of its
    own (SQLite), held there to the bytes it stores; every other transaction is held to
    FoundationDB's count on both backends."""
    store = make_store(StoreLimits(max_transaction_bytes=50_000))
    keys = pa.array(range(500), pa.int64())
    # Each add counts its key three times and 77 bytes more as FoundationDB counts it (over
    # 100 bytes a key here), and its key and 8 bytes stored (under 100).
    with pytest.raises(TransactionTooLargeError, match="50000-byte transaction limit"):
        store.transact(lambda txn: txn.add_many(("n",), keys, keys))
    on_foundationdb = store.url.startswith("fdb:")
    assert store.limits_transaction_size is on_foundationdb
    txn = ReplayingTransaction(store, splittable=True)
    if on_foundationdb:
        with pytest.raises(TransactionTooLargeError, match="50000-byte transaction limit"):
            txn.add_many(("n",), keys, keys)
        txn.reset()
    else:
        txn.add_many(("n",), keys, keys)
        assert txn.commit_size <= 50_000 < txn.write_size
        txn.commit()
        txn = ReplayingTransaction(store, splittable=True)
        more = pa.array(range(1000), pa.int64())
        with pytest.raises(TransactionTooLargeError, match="50000-byte transaction limit"):
            txn.add_many(("m",), more, more)  # past the limit in stored bytes too
        txn.reset()
    with store.read() as read:
        stored = read.get_range_startswith(())
    expected = [] if on_foundationdb else [(("n", k), encode_int64(k)) for k in range(500)]
    assert stored == expected


def test_transaction_time_limit(make_store: StoreFactory) -> None:
    store = make_store(StoreLimits(max_transaction_seconds=0.05))
    txn = store.create_transaction()
    txn.get(("k",))
    time.sleep(0.1)
    txn.set(("k",), b"late")
    with pytest.raises(TransactionTooOldError, match="limit"):
        txn.commit()
    assert store.transact(lambda t: t.get(("k",))) is None


# -- scoped views -----------------------------------------------------------------------


def test_a_scoped_view_writes_under_its_prefix_within_the_transaction(store: Store) -> None:
    other_prefix = (*store.prefix, "other")
    other = open_store(store.url, prefix=other_prefix)
    try:
        txn = store.create_transaction()
        view = txn.scoped(other_prefix)
        view.set(("k",), b"v")
        view.add(("n",), 3)
        assert view.get(("k",)) == b"v", "the view reads its own writes"
        assert txn.get(("other", "k")) == b"v", "the same write, seen from the parent"
        assert txn.write_size >= len(b"v"), "the view's writes count against the transaction"
        assert other.transact(lambda t: t.get(("k",))) is None, "nothing before the commit"
        txn.commit()
        assert other.transact(lambda t: t.get(("k",))) == b"v"
        assert decode_int64(other.transact(lambda t: t.get(("n",))) or b"") == 3

        dropped = store.create_transaction()
        dropped.scoped(other_prefix).set(("k",), b"dropped")
        dropped.reset()
        assert other.transact(lambda t: t.get(("k",))) == b"v"

        # A read through the view is conflict-checked like any read of the transaction.
        reader = store.create_transaction()
        assert reader.scoped(other_prefix).get(("k",)) == b"v"
        other.transact(lambda t: t.set(("k",), b"changed"))
        reader.set(("mine",), b"x")
        with pytest.raises(StoreConflictError):
            reader.commit()
    finally:
        other.transact(lambda t: t.clear_range_startswith(()))
        other.close()
