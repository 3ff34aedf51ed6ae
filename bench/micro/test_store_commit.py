"""Commits of the embedded store (SQLite, WAL, ``synchronous=FULL``, a file on disk).

A small transaction (what a mapper's batch record, a heartbeat or an input trim writes), a
reducer-like read-check-write of one state key, and the keyed sum's batch ``add_many`` of
100,000 int64 keys, as inserts into an empty keyspace and as updates of existing keys. The
last two open their transaction as a reducer opens its commit of several rows
(``ReplayingTransaction``, ``splittable``): held to what the store takes, not to
FoundationDB's count, which 100,000 keys in one transaction exceed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from millstream.state import Store, StoreTransaction
from millstream.state.replay import ReplayingTransaction

N = 100_000


def test_commit_small(benchmark: Any, store: Store) -> None:
    """Set one key, commit (one fsync of the WAL)."""
    counter = iter(range(10**9))

    def commit() -> None:
        txn = store.create_transaction()
        txn.set(("small", next(counter) % 1000), b"x" * 64)
        txn.commit()

    benchmark(commit)


def test_commit_read_check_write(benchmark: Any, store: Store) -> None:
    """Read a key, write it back changed, commit (conflict check included): a state update."""

    def update(txn: StoreTransaction) -> None:
        raw = txn.get(("state",))
        value = int.from_bytes(raw, "little") if raw else 0
        txn.set(("state",), (value + 1).to_bytes(8, "little"))

    benchmark(store.transact, update)


def _keys_and_deltas() -> tuple[pa.Array, pa.Array]:
    rng = np.random.default_rng(3)
    return pa.array(rng.permutation(N).astype(np.int64)), pa.array(
        rng.integers(1, 100, N, dtype=np.int64)
    )


def test_add_many_100k_insert(benchmark: Any, store: Store) -> None:
    """``add_many`` of 100,000 new int64 keys in one transaction."""
    keys, deltas = _keys_and_deltas()
    space = iter(range(10**9))

    def insert() -> None:
        txn = ReplayingTransaction(store, splittable=True)
        txn.add_many(("ins", next(space)), keys, deltas)
        txn.commit()

    benchmark.extra_info["keys"] = N
    benchmark.pedantic(insert, rounds=10, warmup_rounds=1)


def test_add_many_100k_update(benchmark: Any, store: Store) -> None:
    """``add_many`` to 100,000 existing int64 keys in one transaction (the keyed sum's case)."""
    keys, deltas = _keys_and_deltas()

    def update() -> None:
        txn = ReplayingTransaction(store, splittable=True)
        txn.add_many(("upd",), keys, deltas)
        txn.commit()

    update()
    benchmark.extra_info["keys"] = N
    benchmark.pedantic(update, rounds=10, warmup_rounds=1)
