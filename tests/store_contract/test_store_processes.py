"""Several OS processes transacting on one store end with exact totals."""

from __future__ import annotations

import multiprocessing

import pyarrow as pa
from millstream.exceptions import StoreUnavailableError
from millstream.state import Store, StoreTransaction, decode_int64, encode_int64

PROCESSES = 4
ROUNDS = 40
COUNTERS = 3


def _increment_all(txn: StoreTransaction) -> None:
    for c in range(COUNTERS):
        raw = txn.get(("counter", c))
        current = decode_int64(raw) if raw is not None else 0
        txn.set(("counter", c), encode_int64(current + 1))
    txn.add_many(("adds",), pa.array(range(COUNTERS)), pa.array([1] * COUNTERS))


def _worker(store: Store) -> None:
    for _ in range(ROUNDS):
        store.transact(_increment_all, max_retries=None)
    store.close()


def test_read_modify_write_from_several_processes_is_exact(store: Store) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(store,)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert [w.exitcode for w in workers] == [0] * PROCESSES
    total = PROCESSES * ROUNDS
    for c in range(COUNTERS):
        assert store.transact(lambda t, c=c: t.get(("counter", c))) == encode_int64(total)
        assert store.transact(lambda t, c=c: t.get(("adds", c))) == encode_int64(total)


def _forked_child(store: Store, queue: multiprocessing.Queue[int]) -> None:
    store.transact(lambda t: t.add(("forked",), 1))
    queue.put(decode_int64(store.transact(lambda t: t.get(("forked",))) or b""))


def _forked_child_on_fdb(store: Store, queue: multiprocessing.Queue[str]) -> None:
    try:
        store.transact(lambda t: t.add(("forked",), 1))
        queue.put("the forked child used the parent's FoundationDB client")
    except StoreUnavailableError as exc:
        queue.put(str(exc))


def test_store_used_in_a_forked_child_opens_its_own_connections(store: Store) -> None:
    """SQLite reopens its connections in a forked child. FoundationDB keeps this promise
    differently: its client's network thread does not survive fork, so a forked child gets
    a clear error naming the fix (workers are spawned, and reopen the store from its URL)."""
    if store.url.startswith("fdb"):
        fork = multiprocessing.get_context("fork")
        errors: multiprocessing.Queue[str] = fork.Queue()
        child = fork.Process(target=_forked_child_on_fdb, args=(store, errors))
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
        assert "spawn" in errors.get(timeout=5)
        return
    store.transact(lambda t: t.add(("forked",), 1))
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[int] = context.Queue()
    child = context.Process(target=_forked_child, args=(store, queue))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 2
    store.transact(lambda t: t.add(("forked",), 1))
    assert store.transact(lambda t: t.get(("forked",))) == encode_int64(3)
