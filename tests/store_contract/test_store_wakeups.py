"""Waiting for a key to change: a reader at the end of its input sleeps until a writer's
commit wakes it, instead of polling the store."""

from __future__ import annotations

import multiprocessing
import threading

from millstream.state import Store, StoreTransaction, open_store

LONG = 120.0
"""A wait this long ends only when something wakes it (the tests join well before)."""

KEY = ("watched",)


def _waiter(store: Store) -> threading.Thread:
    """A thread that waits once briefly (so that its wait is registered), says it is
    ready, then waits ``LONG`` for the key to be set."""
    ready = threading.Event()

    def run() -> None:
        store.wait_for(KEY, lambda value: value is not None, 0.01)
        ready.set()
        store.wait_for(KEY, lambda value: value is not None, LONG)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    return thread


def _write(txn: StoreTransaction) -> None:
    txn.set(KEY, b"now")
    txn.wake_on_commit(KEY)


def _write_in_child(store: Store) -> None:
    store.transact(_write)
    store.close()


def test_a_wait_whose_condition_holds_returns_at_once(store: Store) -> None:
    store.transact(lambda txn: txn.set(KEY, b"there"))
    done = threading.Event()

    def run() -> None:
        store.wait_for(KEY, lambda value: value == b"there", LONG)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "the condition held, yet wait_for slept"


def test_a_commit_in_another_process_wakes_the_waiter(store: Store) -> None:
    thread = _waiter(store)
    child = multiprocessing.get_context("spawn").Process(target=_write_in_child, args=(store,))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    thread.join(30)
    assert not thread.is_alive(), "the writer's commit did not wake the waiting reader"


def test_a_commit_in_this_process_wakes_the_waiter(store: Store) -> None:
    thread = _waiter(store)
    store.transact(_write)
    thread.join(30)
    assert not thread.is_alive(), "the writer's commit did not wake the waiting reader"


def test_a_commit_that_leaves_the_key_unchanged_still_wakes_the_waiter(store: Store) -> None:
    """What a queue's seal does: name the watched key with ``wake_on_commit`` without
    writing it, here through a view under the waiter's prefix from a store under another
    (as a reducer appends to a queue). FoundationDB's watches fire only on a changed
    value, so its store bumps a wake counter that ``wait_for`` watches too."""
    thread = _waiter(store)
    other = open_store(store.url, prefix=(*store.prefix, "elsewhere"))
    try:
        other.transact(lambda txn: txn.scoped(store.prefix).wake_on_commit(KEY))
    finally:
        other.close()
    thread.join(30)
    assert not thread.is_alive(), "a commit naming the key did not wake the waiting reader"
