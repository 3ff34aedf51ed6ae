"""Fencing: the persisted-state checks that keep a second live instance of a worker (split
brain), a superseded one, or a forged GetRows from losing or doubling a row's effect.

- A mapper writes (batch plans, its state, spilled rows, its drained marker) only in a
  transaction that re-reads its persisted state and finds the one it last saw
  (:func:`check_mapper_state`); at least once, also that it still owns its mapper's
  numbering.
- A reducer's commit re-reads the reducer's state with conflicts (a step of the commit:
  :mod:`millstream.workers.reducer_worker.commit`, counted in ``split_brains``) and, at
  least once, that every instance that served its rows still owns the numbering
  (:func:`read_commit_fences`, which reads both in one batch; counted in
  ``superseded_fetches``).
- Claims: a GetRows request carries the reducer's committed row index, and the window pops
  (frees) every row up to it. A request forged by anyone who can reach the mapper's
  server, or sent by a reducer that broke the protocol, can claim rows that no reducer
  committed. The window cannot tell; the store can. So the mapper records the highest
  index each reducer claimed before the window pops (:class:`Claims`), and persists its
  state (which lets the input be trimmed) only in a transaction that reads, from the
  store, that every recorded claim is committed (:func:`check_claims`). A claim beyond the
  store raises :class:`~millstream.exceptions.WindowLostRowsError`: the mapper restarts
  from its persisted state, which re-produces the dropped rows.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from millstream.exceptions import MapperSupersededError, SplitBrainError, WindowLostRowsError
from millstream.ledger import (
    MapperState,
    ReducerState,
    decode_mapper_state,
    decode_numbering,
    decode_reducer_state,
    mapper_state_key,
    numbering_key,
    reducer_state_key,
)
from millstream.state import StoreTransaction


class Claims:
    """The highest committed row index each reducer claimed in a GetRows, thread-safe.

    One belongs to one window for its whole life and is never cleared: a new window comes
    with a new one (:class:`~millstream.workers.mapper_worker.window_service.ServingState`),
    so no claim made against a window can be lost while that window's state may still be
    persisted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[int, int] = {}

    def record(self, reducer_index: int, committed_row_index: int) -> None:
        """Note a claim; call it before the window pops the reducer's rows."""
        with self._lock:
            if committed_row_index > self._claims.get(reducer_index, -1):
                self._claims[reducer_index] = committed_row_index

    def snapshot(self) -> dict[int, int]:
        """The claims now. Take it right after reading the window's local state: every pop
        that state reflects was claimed before, and committed before it was claimed."""
        with self._lock:
            return dict(self._claims)


def check_claims(
    txn: StoreTransaction, mapper_index: int, num_mappers: int, claims: dict[int, int]
) -> None:
    """Raise :class:`WindowLostRowsError` unless the store holds every claim.

    The reducers' states are read in one batch, as snapshots: committed indices only grow,
    so a value that covers a claim still does at commit, and the mapper's transaction does
    not conflict with the reducers' commits.
    """
    claimed_by = sorted(claims.items())
    raw = txn.get_each([reducer_state_key(r) for r, _ in claimed_by], snapshot=True)
    for (reducer_index, claimed), value in zip(claimed_by, raw, strict=True):
        state = decode_reducer_state(value, reducer_index, num_mappers)
        committed = state.committed_row_indices[mapper_index]
        if claimed > committed:
            raise WindowLostRowsError(
                f"mapper {mapper_index}: reducer {reducer_index} asked for rows after shuffle "
                f"index {claimed}, but the store says it committed only up to {committed}. "
                "The window dropped rows that no reducer committed (a forged GetRows, or a "
                "reducer that broke the protocol); restarting from the persisted state, which "
                "produces them again. Secure the GetRows channel (mutual TLS) if this repeats"
            )


def read_commit_fences(
    txn: StoreTransaction,
    reducer_index: int,
    num_partitions: int,
    served_by: Mapping[int, str],
) -> tuple[ReducerState, dict[int, str]]:
    """The reads that fence a reducer's commit, in one batch (one round trip on a store
    over the network), with conflicts: the reducer's state, which the commit compares
    with the one its round started from (split brain), and, at least once, which of the
    mapper instances of ``served_by`` (mapper index: GUID of the instance that served
    rows; empty exactly once) no longer own their mapper's numbering: rows of an instance
    a newer one took over from may be numbered differently from the newer one's, so they
    are not committed.

    Returns:
        The reducer's state and the superseded instances (mapper index: GUID).
    """
    mappers = sorted(served_by)
    raw = txn.get_each([reducer_state_key(reducer_index)] + [numbering_key(m) for m in mappers])
    state = decode_reducer_state(raw[0], reducer_index, num_partitions)
    superseded = {
        m: served_by[m]
        for m, owner in zip(mappers, raw[1:], strict=True)
        if decode_numbering(owner, m) != served_by[m]
    }
    return state, superseded


def check_mapper_state(
    txn: StoreTransaction,
    mapper_index: int,
    mapper_guid: str,
    persisted: MapperState,
    *,
    at_least_once: bool,
) -> None:
    """A mapper's check before it writes: the persisted state ``txn`` sees must be the one
    the instance ``mapper_guid`` last saw (thesis 4.3.3 step 3).

    Raises:
        SplitBrainError: Another instance wrote the mapper's state.
        MapperSupersededError: At least once, another instance took over the numbering of
            the mapper's rows.
    """
    keys = [mapper_state_key(mapper_index)]
    if at_least_once:
        keys.append(numbering_key(mapper_index))
    raw = txn.get_each(keys)  # one round trip on a store over the network
    if at_least_once:
        owner = decode_numbering(raw[1], mapper_index)
        if owner != mapper_guid:
            raise MapperSupersededError(
                f"mapper {mapper_index}: instance {owner} took over the numbering of this "
                f"mapper's rows from instance {mapper_guid}, which stops"
            )
    current = decode_mapper_state(raw[0], mapper_index)
    if current != persisted:
        raise SplitBrainError(
            f"mapper {mapper_index}: persisted state changed under this instance "
            f"({persisted} -> {current}); another instance is running"
        )
