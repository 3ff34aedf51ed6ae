"""The FoundationDB store waits for the binding's futures inside the client library.

The binding's own wait needs FoundationDB's network thread to take the GIL for a callback;
the store's (:func:`millstream.state.fdb_backend._block_in_client`) does not. These cases
run transactions, a failing one and a watch beside threads that hold the GIL, and check
results, not speed (``bench/fdb_waits.py`` measures that).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from millstream.exceptions import StoreUnavailableError
from millstream.state import StoreTransaction, open_store
from millstream.state.fdb_backend import _block_in_client, load_fdb

pytestmark = pytest.mark.fdb


@pytest.fixture
def busy_threads() -> Iterator[None]:
    """Two threads running Python for the length of the test."""
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    yield
    stop.set()
    for thread in threads:
        thread.join()


def test_loading_the_binding_installs_the_client_side_wait(fdb_url: str) -> None:
    open_store(fdb_url).close()
    assert load_fdb().impl.Future.block_until_ready is _block_in_client


def test_transactions_beside_busy_threads_each_apply_once(fdb_url: str, busy_threads: None) -> None:
    store = open_store(fdb_url, prefix=("fdb-waits", "count"))

    def increment(txn: StoreTransaction) -> None:
        raw = txn.get(("n",))
        txn.set(("n",), str(int(raw or b"0") + 1).encode())

    try:
        store.transact(lambda txn: txn.clear_range_startswith(()))
        for _ in range(40):
            store.transact(increment)
        assert store.transact(lambda txn: txn.get(("n",))) == b"40"
    finally:
        store.transact(lambda txn: txn.clear_range_startswith(()))
        store.close()


def test_a_future_that_fails_raises_its_error_after_the_wait(
    fdb_url: str, busy_threads: None
) -> None:
    # A transaction timeout of 500 ms, passed before the read: the read's future fails, the
    # wait returns and the error surfaces.
    store = open_store(f"{fdb_url}?timeout_ms=500", prefix=("fdb-waits", "timeout"))
    try:
        txn = store.create_transaction()
        time.sleep(1.0)
        with pytest.raises(StoreUnavailableError, match="transaction timeout"):
            txn.get(("k",))
    finally:
        store.close()


def test_a_watch_fires_beside_busy_threads(fdb_url: str, busy_threads: None) -> None:
    store = open_store(fdb_url, prefix=("fdb-waits", "watch"))
    store.transact(lambda txn: txn.clear(("flag",)))
    writer = threading.Timer(0.2, lambda: store.transact(lambda t: t.set(("flag",), b"1")))
    writer.start()
    try:
        began = time.monotonic()
        store.wait_for(("flag",), lambda value: value == b"1", timeout_seconds=120)
        # Returned before its timeout: the watch fired (wait_for returns either way).
        assert time.monotonic() - began < 120
        assert store.transact(lambda txn: txn.get(("flag",))) == b"1"
    finally:
        writer.join()
        store.transact(lambda txn: txn.clear_range_startswith(()))
        store.close()
