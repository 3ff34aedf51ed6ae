"""The fences' reads on every backend (:mod:`millstream.workers.fencing`): each reads its
records in one batch, and what it reads with conflicts still fences the transaction it is
part of, against a takeover or another instance's write committed in between; the claims'
snapshot reads do not."""

from __future__ import annotations

import pytest
from millstream.exceptions import (
    MapperSupersededError,
    SplitBrainError,
    StoreConflictError,
    WindowLostRowsError,
)
from millstream.ledger import (
    MapperState,
    ReducerState,
    read_mapper_state,
    write_mapper_state,
    write_numbering,
    write_reducer_state,
)
from millstream.state import Store, StoreTransaction
from millstream.workers.fencing import check_claims, check_mapper_state, read_commit_fences

PARTITIONS = 3


def seed(store: Store) -> MapperState:
    """Reducer 0 committed up to (4, 5, 6) and reducer 1 up to (1, 2, 3); mappers 0-2 are
    numbered by instances ``m0``-``m2``; mapper 0's state is returned as written."""

    def write(txn: StoreTransaction) -> MapperState:
        write_reducer_state(txn, 0, ReducerState((4, 5, 6)))
        write_reducer_state(txn, 1, ReducerState((1, 2, 3)))
        for m in range(PARTITIONS):
            write_numbering(txn, m, f"m{m}")
        return write_mapper_state(txn, 0, MapperState(10, 20, b"t", 0))

    written: MapperState = store.transact(write)
    return written


def test_the_commit_fences_read_the_state_and_the_superseded_instances(store: Store) -> None:
    seed(store)
    txn = store.create_transaction()
    try:
        served_by = {2: "m2", 0: "m0-old", 1: "m1"}
        assert read_commit_fences(txn, 0, PARTITIONS, served_by) == (
            ReducerState((4, 5, 6)),
            {0: "m0-old"},
        )
        # Exactly once nothing is served by name; a reducer never committed starts at -1.
        assert read_commit_fences(txn, 2, PARTITIONS, {}) == (ReducerState((-1, -1, -1)), {})
        # The transaction's own write is what it reads (a replayed commit reads its own).
        write_numbering(txn, 0, "m0-old")
        assert read_commit_fences(txn, 0, PARTITIONS, served_by)[1] == {}
    finally:
        txn.reset()


@pytest.mark.parametrize("between", ["takeover", "commit"])
def test_a_write_between_the_commit_fences_and_the_commit_conflicts(
    store: Store, between: str
) -> None:
    """A mapper instance taking over the numbering, or another instance of the reducer
    committing, after the fences were read: the commit fails instead of landing."""
    seed(store)
    txn = store.create_transaction()
    state, superseded = read_commit_fences(txn, 0, PARTITIONS, {0: "m0", 1: "m1"})
    assert (state, superseded) == (ReducerState((4, 5, 6)), {})
    if between == "takeover":
        store.transact(lambda t: write_numbering(t, 1, "m1-new"))
    else:
        store.transact(lambda t: write_reducer_state(t, 0, ReducerState((5, 5, 6))))
    write_reducer_state(txn, 0, ReducerState((7, 8, 9)))
    with pytest.raises(StoreConflictError):
        txn.commit()
    txn.reset()
    assert store.transact(lambda t: read_commit_fences(t, 0, PARTITIONS, {})[0]) != ReducerState(
        (7, 8, 9)
    )


@pytest.mark.parametrize("at_least_once", [False, True], ids=["exactly_once", "at_least_once"])
def test_the_mapper_check_fences_its_writes(store: Store, at_least_once: bool) -> None:
    persisted = seed(store)

    def check(txn: StoreTransaction, guid: str = "m0") -> None:
        check_mapper_state(txn, 0, guid, persisted, at_least_once=at_least_once)

    store.transact(check)
    if at_least_once:
        # Another instance's numbering is checked first: this one stops, not restarts.
        with pytest.raises(MapperSupersededError, match="took over the numbering"):
            store.transact(lambda t: check(t, "m0-old"))
    else:
        store.transact(lambda t: check(t, "m0-old"))  # exactly once, numbering is not read
    # Another instance's state written between the check and the write: the write conflicts.
    txn = store.create_transaction()
    check(txn)
    store.transact(lambda t: write_mapper_state(t, 0, persisted))
    write_mapper_state(txn, 0, MapperState(11, 21, b"u", persisted.version))
    with pytest.raises(StoreConflictError):
        txn.commit()
    txn.reset()
    # And the next check sees it.
    with pytest.raises(SplitBrainError, match="persisted state changed"):
        store.transact(check)
    assert store.transact(lambda t: read_mapper_state(t, 0)).input_unread_row_index == 10


def test_claims_are_checked_against_every_reducer_without_conflicts(store: Store) -> None:
    seed(store)
    # Mapper 1's claims: reducer 0 committed through 5, reducer 1 through 2.
    store.transact(lambda t: check_claims(t, 1, PARTITIONS, {1: 2, 0: 5}))
    store.transact(lambda t: check_claims(t, 1, PARTITIONS, {}))
    with pytest.raises(WindowLostRowsError, match="reducer 1 asked for rows after shuffle index 3"):
        store.transact(lambda t: check_claims(t, 1, PARTITIONS, {0: 5, 1: 3}))
    # Snapshot reads: a reducer committing meanwhile does not fail the mapper's write.
    txn = store.create_transaction()
    check_claims(txn, 1, PARTITIONS, {0: 5, 1: 2})
    store.transact(lambda t: write_reducer_state(t, 1, ReducerState((2, 3, 4))))
    write_mapper_state(txn, 1, MapperState(3, 3, b"", 0))
    txn.commit()
