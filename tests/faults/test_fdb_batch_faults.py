"""Faults inside FoundationDB's batch operations (issued by the Rust core,
:mod:`millstream.state.fdb_batch`), on a real cluster: a read that fails inside the loop,
a conflict on the reads of counter lanes, writes the cluster refuses at commit. Each
raises the store error the binding's own calls raise, writes nothing, and leaves the
transaction usable after ``reset``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from millstream.exceptions import (
    KeyTooLargeError,
    StoreConflictError,
    StoreUnavailableError,
    ValueTooLargeError,
)
from millstream.state import Store, StoreLimits, decode_int64s, encode_int64s, open_store

pytestmark = pytest.mark.fdb

TIMEOUT_MS = 5000
"""Long enough for a small commit on a loaded CI machine after the reset, which the same
timeout bounds."""
NO_LIMITS = StoreLimits(
    max_key_bytes=1_000_000,
    max_value_bytes=100_000_000,
    max_transaction_bytes=1_000_000_000,
    max_transaction_seconds=3600.0,
)
"""Limits millstream does not reach first, so that the cluster's own are met."""
KEYS = pa.array([1, 2, 3], pa.int64())
LANES = pa.record_batch({"a": pa.array([1, 1, 1]), "b": pa.array([-1, -1, -1])})


def _open(url: str) -> Iterator[Store]:
    store = open_store(url, prefix=("fdb-batch-faults", time.time_ns()), limits=NO_LIMITS)
    try:
        yield store
    finally:
        store.transact(lambda txn: txn.clear_range_startswith(()))
        store.close()


@pytest.fixture
def store(fdb_url: str) -> Iterator[Store]:
    yield from _open(fdb_url)


@pytest.fixture
def timing_out(fdb_url: str) -> Iterator[Store]:
    """The same cluster with transactions cancelled :data:`TIMEOUT_MS` after they start."""
    yield from _open(f"{fdb_url}?timeout_ms={TIMEOUT_MS}")


def _lanes(store: Store, keys: pa.Array = KEYS) -> list[tuple[int, ...]]:
    values = store.transact(lambda txn: txn.get_many(("c",), keys))
    return [decode_int64s(v, 2) for v in values]


@pytest.mark.parametrize("operation", ["add_lanes", "get_many"])
def test_a_read_that_fails_inside_the_loop_raises_the_store_error_and_resets(
    timing_out: Store, operation: str
) -> None:
    """Every read of the batch fails (the transaction timed out while the caller waited):
    the loop stops at the first, raises what the binding's ``get`` raises, destroys its
    futures and writes nothing; after ``reset`` the same transaction works."""
    txn = timing_out.create_transaction()
    run = {
        "add_lanes": lambda: txn.add_many(("c",), KEYS, LANES),
        "get_many": lambda: txn.get_many(("c",), KEYS),
    }[operation]
    time.sleep(TIMEOUT_MS / 1000 * 1.5)
    with pytest.raises(StoreUnavailableError, match="FoundationDB error 1031"):
        run()
    txn.reset()
    txn.add_many(("c",), KEYS, LANES)
    txn.commit()
    assert _lanes(timing_out) == [(1, -1)] * 3


def test_a_conflict_on_the_reads_of_counter_lanes_fails_the_commit(store: Store) -> None:
    """Counter lanes on FoundationDB are read and written back: a commit in between that
    changes a key fails this one with a conflict, which a retry after ``reset`` resolves."""
    store.transact(lambda txn: txn.set(("c", 2), encode_int64s([10, 10])))
    txn = store.create_transaction()
    txn.add_many(("c",), KEYS, LANES)
    store.transact(lambda txn: txn.set(("c", 2), encode_int64s([100, 100])))
    with pytest.raises(StoreConflictError, match="retry"):
        txn.commit()
    assert _lanes(store) == [(0, 0), (100, 100), (0, 0)]
    txn.reset()
    txn.add_many(("c",), KEYS, LANES)
    txn.commit()
    assert _lanes(store) == [(1, -1), (101, 99), (1, -1)]


def test_a_value_the_cluster_refuses_fails_the_commit_and_writes_nothing(store: Store) -> None:
    """A value past FoundationDB's 100 kB in a batch (millstream's own check set aside):
    the cluster refuses it at commit with the store's error, none of the batch lands."""
    txn = store.create_transaction()
    values = pa.array([b"small", b"x" * 100_001, b"small"], pa.binary())
    txn.set_many(("v",), KEYS, values)
    with pytest.raises(ValueTooLargeError, match="split it over keys"):
        txn.commit()
    txn.reset()
    assert txn.get_many(("v",), KEYS) == [None] * 3
    txn.set_many(("v",), KEYS, pa.array([b"a", b"b", b"c"], pa.binary()))
    txn.commit()
    assert store.transact(lambda t: t.get_many(("v",), KEYS)) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("width", [1, 2], ids=["counter", "lanes"])
def test_a_key_the_cluster_refuses_fails_the_commit_and_writes_nothing(
    store: Store, width: int
) -> None:
    """A key past FoundationDB's 10 kB in an ``add_many`` (millstream's own check set
    aside): refused at commit with the store's error; nothing of the batch lands."""
    keys = pa.array(["a", "k" * 10_001, "b"])
    deltas = LANES if width == 2 else LANES.column(0)
    txn = store.create_transaction()
    txn.add_many(("c",), keys, deltas)
    with pytest.raises(KeyTooLargeError, match="10 kB"):
        txn.commit()
    txn.reset()
    assert store.transact(lambda t: t.get_range_startswith(("c",))) == []
