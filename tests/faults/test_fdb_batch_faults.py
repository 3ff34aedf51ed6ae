"""Faults inside FoundationDB's batch operations (issued by the Rust core,
:mod:`millstream.state.fdb_batch`), on a real cluster: a read that fails inside the loop,
adds issued after the transaction timed out, writes the cluster refuses at commit. Each
raises the store error the binding's own calls raise, writes nothing, and leaves the
transaction usable after ``reset``; counter lanes, added without a read, never conflict."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from millstream.exceptions import (
    CommitUnknownResultError,
    KeyTooLargeError,
    StoreUnavailableError,
    ValueTooLargeError,
)
from millstream.state import Store, StoreLimits, decode_int64s, open_store

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


def test_a_read_that_fails_inside_the_loop_raises_the_store_error_and_resets(
    timing_out: Store,
) -> None:
    """Every read of the batch fails (the transaction timed out while the caller waited):
    the loop stops at the first, raises what the binding's ``get`` raises and destroys its
    futures; after ``reset`` the same transaction works."""
    txn = timing_out.create_transaction()
    time.sleep(TIMEOUT_MS / 1000 * 1.5)
    with pytest.raises(StoreUnavailableError, match="FoundationDB error 1031"):
        txn.get_many(("c",), KEYS)
    txn.reset()
    txn.add_many(("c",), KEYS, LANES)
    txn.commit()
    assert _lanes(timing_out) == [(1, -1)] * 3


def test_lanes_added_after_a_timeout_fail_the_commit_and_land_nothing(
    timing_out: Store,
) -> None:
    """Lane adds issue no read, so a transaction that timed out before its commit fails
    there (with the store's "may or may not have been applied", as any commit that times
    out); this one timed out before the commit was sent, so nothing of the batch lands,
    and after ``reset`` the same adds land once."""
    txn = timing_out.create_transaction()
    time.sleep(TIMEOUT_MS / 1000 * 1.5)
    txn.add_many(("c",), KEYS, LANES)
    with pytest.raises(CommitUnknownResultError, match="FoundationDB error 1031"):
        txn.commit()
    assert _lanes(timing_out) == [(0, 0)] * 3
    txn.reset()
    txn.add_many(("c",), KEYS, LANES)
    txn.commit()
    assert _lanes(timing_out) == [(1, -1)] * 3


def test_counter_lanes_added_by_two_transactions_at_once_both_land(store: Store) -> None:
    """Counter lanes on FoundationDB are one atomic ``ADD`` per key, never read: a commit
    in between that adds to the same keys does not fail this one, and both adds count."""
    txn = store.create_transaction()
    txn.add_many(("c",), KEYS, LANES)
    store.transact(lambda other: other.add_many(("c",), KEYS, LANES))
    txn.commit()
    assert _lanes(store) == [(2, -2)] * 3


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
