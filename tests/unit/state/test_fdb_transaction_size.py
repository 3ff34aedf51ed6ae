"""Every backend counts a transaction's size as FoundationDB does, so a job whose commits
fit on the embedded store fits on FoundationDB too.

FoundationDB refuses a commit whose ``get_approximate_size`` passes 10 MB, and that size
counts each write's conflict range and a fixed overhead besides its key and value. Here
random transactions are built on a real cluster and millstream's own count
(``write_size``) is held against the cluster's, operation by operation; then an
``add_many`` just under millstream's limit commits on FoundationDB and on SQLite alike, and
one just over is refused by both with millstream's error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from millstream.exceptions import TransactionTooLargeError
from millstream.state import open_store
from millstream.state.fdb_backend import FdbTransaction
from millstream.state.transaction import StoreTransaction

pytestmark = pytest.mark.fdb

KEY = st.tuples(st.sampled_from(["a", "bb", "counts"]), st.integers(0, 10**12))
VALUE = st.binary(max_size=300)

READS = st.one_of(
    st.tuples(st.just("get"), KEY, st.booleans()),
    st.tuples(st.just("get_many"), st.lists(st.integers(0, 10**9), max_size=20), st.booleans()),
    st.tuples(st.just("get_range_startswith"), KEY, st.booleans()),
)
WRITES = st.one_of(
    st.tuples(st.just("set"), KEY, VALUE),
    st.tuples(st.just("add"), KEY, st.integers(-(2**40), 2**40)),
    st.tuples(st.just("clear"), KEY),
    st.tuples(st.just("clear_range"), KEY, KEY),
    st.tuples(st.just("clear_range_startswith"), KEY),
    st.tuples(st.just("set_many"), st.lists(st.integers(0, 10**9), max_size=20, unique=True)),
    st.tuples(
        st.just("add_many"),
        st.lists(st.integers(0, 10**9), max_size=20, unique=True),
        st.integers(1, 3),
    ),
)


def _apply(txn: StoreTransaction, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "set":
        txn.set(op[1], op[2])
    elif kind == "add":
        txn.add(op[1], op[2])
    elif kind == "clear":
        txn.clear(op[1])
    elif kind == "clear_range":
        txn.clear_range(min(op[1], op[2]), max(op[1], op[2]))
    elif kind == "clear_range_startswith":
        txn.clear_range_startswith(op[1][:1])
    elif kind == "get":
        txn.get(op[1], snapshot=op[2])
    elif kind == "get_many":
        txn.get_many(("m",), pa.array(op[1], pa.int64()), snapshot=op[2])
    elif kind == "get_range_startswith":
        txn.get_range_startswith(op[1][:1], snapshot=op[2])
    elif kind == "set_many":
        keys = pa.array(op[1], pa.int64())
        txn.set_many(("m",), keys, pa.array([b"v" * (k % 50) for k in op[1]], pa.binary()))
    elif kind == "add_many":
        keys = pa.array(op[1], pa.int64())
        lanes = pa.table({f"lane{i}": keys for i in range(op[2])})
        txn.add_many(("n",), keys, lanes if op[2] > 1 else keys)
    else:
        raise AssertionError(kind)


def _fdb_size(txn: StoreTransaction) -> int:
    assert isinstance(txn, FdbTransaction)
    return int(txn._tr.get_approximate_size().wait())


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(reads=st.lists(READS, max_size=6), writes=st.lists(WRITES, min_size=1, max_size=10))
def test_write_size_is_foundationdbs_own_count(
    fdb_url: str, reads: list[tuple], writes: list[tuple]
) -> None:
    """Reads, then writes (a reducer's shape): each operation counts what the cluster does.

    A read after this transaction's own writes is answered partly from them, and the cluster
    counts its conflict ranges around them (fewer or more); millstream counts the read as
    if nothing had been written, the one place where the two may differ.
    """
    with open_store(fdb_url, prefix=("size",)) as store:
        txn = store.create_transaction()
        try:
            for number, op in enumerate([*reads, *writes]):
                before = (txn.write_size, _fdb_size(txn))
                _apply(txn, op)
                ours, theirs = txn.write_size - before[0], _fdb_size(txn) - before[1]
                if op[0] == "add_many" and op[2] > 1 and number > len(reads):
                    # Lanes are read, then written: a key this transaction wrote before
                    # is read from its own writes.
                    assert ours >= theirs, f"{op!r}: millstream {ours}, FoundationDB {theirs}"
                else:
                    assert ours == theirs, f"{op!r}: millstream {ours}, FoundationDB {theirs}"
        finally:
            txn.reset()


def _add_many(count: int) -> Callable[[StoreTransaction], None]:
    keys = pa.array(range(count), pa.int64())
    return lambda txn: txn.add_many(("sum",), keys, keys)


def _fits(count: int) -> int:
    """The write size of an ``add_many`` of ``count`` keys (measured, not committed)."""
    with open_store("sqlite:///:memory:", prefix=("limits",)) as store:
        txn = store.create_transaction()
        try:
            _add_many(count)(txn)
            return txn.write_size
        except TransactionTooLargeError:
            return -1
        finally:
            txn.reset()


def test_the_largest_add_many_that_fits_locally_fits_on_foundationdb(
    fdb_url: str, tmp_path: Path
) -> None:
    low, high = 1, 400_000
    while low + 1 < high:  # the most keys one add_many may write, by millstream's count
        middle = (low + high) // 2
        low, high = (middle, high) if _fits(middle) > 0 else (low, middle)
    for url in (fdb_url, f"sqlite:///{tmp_path / 'state.db'}"):
        with open_store(url, prefix=("limits",)) as store:
            store.transact(_add_many(low))
            with pytest.raises(TransactionTooLargeError):
                store.transact(_add_many(low + 1))
    print(f"an add_many of up to {low:,} int64 keys fits in one transaction on both")
