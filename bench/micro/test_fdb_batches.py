"""FoundationDB's batch operations: a reducer's ``add_many`` of 20,000 existing int64 keys
in one transaction, one counter per key (an atomic ``ADD`` each) and two (counter lanes:
an atomic ``ADD`` of 16-byte slots each). What the Rust core's loop costs (issue 48); on
a one-process cluster started for the module, or skipped without FoundationDB's
binaries.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from millstream.state import Store, open_store

from tests.support.fdb_cluster import find_binaries, start_cluster

pytestmark = pytest.mark.fdb

N = 20_000


@pytest.fixture(scope="module")
def fdb_store() -> Iterator[Store]:
    """A store on a cluster of the module's own, stopped afterwards."""
    binaries, missing = find_binaries(Path(__file__).resolve().parents[2])
    if binaries is None:
        pytest.skip(missing)
    cluster = start_cluster(binaries)
    try:
        store = open_store(cluster.url, prefix=("bench",))
        yield store
        store.close()
    finally:
        cluster.stop()


@pytest.mark.parametrize("counters", [1, 2])
def test_fdb_add_many_20k(benchmark: Any, fdb_store: Store, counters: int) -> None:
    """``add_many`` of 20,000 existing keys in one transaction, then ``reset`` (the batch
    operation alone: no commit)."""
    keys = pa.array(np.random.default_rng(48).permutation(N).astype(np.int64))
    deltas = pa.record_batch({f"c{i}": pa.array(np.ones(N, np.int64)) for i in range(counters)})
    space = ("counters", counters)
    fdb_store.transact(lambda txn: txn.add_many(space, keys, deltas))

    def add() -> None:
        txn = fdb_store.create_transaction()
        txn.add_many(space, keys, deltas)
        txn.reset()

    benchmark.extra_info["keys"] = N
    benchmark.pedantic(add, rounds=5, warmup_rounds=1)
