"""A reducer's records: the committed row index per mapper and its totals (thesis 4.4.1)."""

from __future__ import annotations

from dataclasses import dataclass

from millstream.exceptions import ConfigurationError
from millstream.ledger.subspaces import SYSTEM, bad_record
from millstream.state.keys import pack, unpack
from millstream.state.transaction import StoreTransaction


@dataclass(frozen=True)
class ReducerState:
    """A reducer's persisted state (thesis 4.4.1).

    Attributes:
        committed_row_indices: Per input partition (a mapper's stream), the last shuffle
            row index this reducer has committed; ``-1`` when nothing from it was
            committed yet.
    """

    committed_row_indices: tuple[int, ...]

    @classmethod
    def initial(cls, num_partitions: int) -> ReducerState:
        """The state before the first commit."""
        return cls((-1,) * num_partitions)


def reducer_state_key(reducer_index: int) -> tuple[str, str, int]:
    """The key of reducer ``reducer_index``'s state."""
    return (*SYSTEM, "reducer", reducer_index)


def read_reducer_state(
    txn: StoreTransaction, reducer_index: int, num_partitions: int, *, snapshot: bool = False
) -> ReducerState:
    """Read a reducer's persisted state (``snapshot``: without a read conflict).

    Raises:
        ConfigurationError: The stored state has a different number of partitions.
    """
    raw = txn.get(reducer_state_key(reducer_index), snapshot=snapshot)
    return decode_reducer_state(raw, reducer_index, num_partitions)


def decode_reducer_state(
    raw: bytes | None, reducer_index: int, num_partitions: int
) -> ReducerState:
    """Reducer ``reducer_index``'s state from the value read at :func:`reducer_state_key`
    (the initial state if None), for a read batched with others.

    Raises:
        ConfigurationError: The stored state has a different number of partitions.
    """
    if raw is None:
        return ReducerState.initial(num_partitions)
    try:
        indices = tuple(int(i) for i in unpack(raw))
    except Exception as exc:
        raise bad_record(f"state of reducer {reducer_index}", raw, exc) from exc
    if len(indices) != num_partitions:
        raise ConfigurationError(
            f"reducer {reducer_index} has committed state for {len(indices)} input partitions "
            f"but the processor's input has {num_partitions}; an input's partition count is "
            "fixed for ever (use a new store prefix for the new input)"
        )
    return ReducerState(indices)


def write_reducer_state(txn: StoreTransaction, reducer_index: int, state: ReducerState) -> None:
    """Write a reducer's state (in the transaction that holds the reducer's output)."""
    txn.set(reducer_state_key(reducer_index), pack(tuple(state.committed_row_indices)))


def reduced_key(reducer_index: int, what: str) -> tuple[str, str, int, str]:
    """Counter key of a reducer's committed totals (``rows``, ``bytes``, ``commits``)."""
    return (*SYSTEM, "reduced", reducer_index, what)


def drained_marker_key(reducer_index: int) -> tuple[str, str, int]:
    """Present once reducer ``reducer_index`` committed its ``Reducer.drain`` transaction."""
    return (*SYSTEM, "reducer-drained", reducer_index)
