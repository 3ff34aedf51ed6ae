"""A mapper's records: its persisted state, batch plans, numbering owner, window schema,
drained marker and totals (thesis 4.3.2)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from millstream.ledger.subspaces import SYSTEM, bad_record
from millstream.state.keys import pack, unpack
from millstream.state.transaction import StoreTransaction


@dataclass(frozen=True)
class MapperState:
    """A mapper's persisted state (thesis 4.3.2).

    Attributes:
        input_unread_row_index: First input row not yet fully processed and committed.
        shuffle_unread_row_index: The same point in the shuffle numbering.
        continuation_token: The partition reader's token at that point.
        version: Incremented by every write, so a mapper detects another instance's write
            (split brain) even when the values repeat.
    """

    input_unread_row_index: int = 0
    shuffle_unread_row_index: int = 0
    continuation_token: bytes = b""
    version: int = 0


def mapper_state_key(mapper_index: int) -> tuple[str, str, int]:
    """The key of mapper ``mapper_index``'s state."""
    return (*SYSTEM, "mapper", mapper_index)


def read_mapper_state(txn: StoreTransaction, mapper_index: int) -> MapperState:
    """Read a mapper's persisted state (the initial state if never written)."""
    return decode_mapper_state(txn.get(mapper_state_key(mapper_index)), mapper_index)


def decode_mapper_state(raw: bytes | None, mapper_index: int) -> MapperState:
    """Mapper ``mapper_index``'s state from the value read at :func:`mapper_state_key`
    (the initial state if None), for a read batched with others."""
    if raw is None:
        return MapperState()
    try:
        i, s, token, version = unpack(raw)
        return MapperState(int(i), int(s), bytes(token), int(version))
    except Exception as exc:
        raise bad_record(f"state of mapper {mapper_index}", raw, exc) from exc


def write_mapper_state(txn: StoreTransaction, mapper_index: int, state: MapperState) -> MapperState:
    """Write a mapper's state with its version bumped past the stored one.

    Returns:
        The state as written (with the new version); compare later reads against it.
    """
    stored = read_mapper_state(txn, mapper_index)
    written = MapperState(
        state.input_unread_row_index,
        state.shuffle_unread_row_index,
        state.continuation_token,
        max(state.version, stored.version) + 1,
    )
    txn.set(
        mapper_state_key(mapper_index),
        pack(
            (
                written.input_unread_row_index,
                written.shuffle_unread_row_index,
                written.continuation_token,
                written.version,
            )
        ),
    )
    return written


def drained_key(mapper_index: int) -> tuple[str, str, int]:
    """Key a mapper sets once every row of its bounded input has its effect committed."""
    return (*SYSTEM, "drained", mapper_index)


def drained_mappers(txn: StoreTransaction, num_partitions: int) -> set[int]:
    """The mappers among ``num_partitions`` that set their :func:`drained_key`, read
    together as a snapshot (one round trip on a store over the network)."""
    found = txn.get_each([drained_key(i) for i in range(num_partitions)], snapshot=True)
    return {index for index, raw in enumerate(found) if raw is not None}


def plan_key(mapper_index: int, begin_row_index: int) -> tuple[str, str, int, int]:
    """Key of the recorded end of mapper ``mapper_index``'s batch starting at an input row."""
    return (*SYSTEM, "plan", mapper_index, begin_row_index)


def clear_batch_plans(txn: StoreTransaction, mapper_index: int, below_row_index: int) -> None:
    """Clear mapper ``mapper_index``'s batch plans of the batches that start below input row
    ``below_row_index``: persisted past, they are never read again."""
    txn.clear_range(plan_key(mapper_index, 0), plan_key(mapper_index, below_row_index))


def numbering_key(mapper_index: int) -> tuple[str, str, int]:
    """Key naming the mapper instance whose shuffle numbering counts (at-least-once only).

    Without batch-boundary records, two instances of a mapper may cut its input into
    different batches and so number the same shuffle indices differently; only the rows of
    the instance named here may be committed.
    """
    return (*SYSTEM, "numbering", mapper_index)


def read_numbering(txn: StoreTransaction, mapper_index: int) -> str | None:
    """The GUID of the instance whose numbering counts for ``mapper_index`` (None: none yet)."""
    return decode_numbering(txn.get(numbering_key(mapper_index)), mapper_index)


def decode_numbering(raw: bytes | None, mapper_index: int) -> str | None:
    """The numbering owner from the value read at :func:`numbering_key`, for a read
    batched with others."""
    if raw is None:
        return None
    try:
        return str(unpack(raw)[0])
    except Exception as exc:
        raise bad_record(f"numbering of mapper {mapper_index}", raw, exc) from exc


def write_numbering(txn: StoreTransaction, mapper_index: int, mapper_guid: str) -> None:
    """Make instance ``mapper_guid``'s numbering the one that counts for ``mapper_index``."""
    txn.set(numbering_key(mapper_index), pack((mapper_guid,)))


def mapped_key(mapper_index: int, what: str) -> tuple[str, str, int, str]:
    """Counter key of a mapper's totals (``batches``: map calls whose rows were persisted)."""
    return (*SYSTEM, "mapped", mapper_index, what)


def window_schema_key(mapper_index: int) -> tuple[str, str, int]:
    """Key of the unified schema of a mapper's mapped rows, once they changed schema."""
    return (*SYSTEM, "window_schema", mapper_index)


def read_window_schema(txn: StoreTransaction, mapper_index: int) -> pa.Schema | None:
    """The schema mapper ``mapper_index``'s window carries (None: its mapped rows never
    widened, the first batch's schema is the window's)."""
    raw = txn.get(window_schema_key(mapper_index))
    if raw is None:
        return None
    try:
        return pa.ipc.read_schema(pa.py_buffer(raw))
    except Exception as exc:
        raise bad_record(f"window schema of mapper {mapper_index}", raw, exc) from exc


def write_window_schema(txn: StoreTransaction, mapper_index: int, schema: pa.Schema) -> None:
    """Record the schema mapper ``mapper_index``'s window carries from now on (it only
    widens: :func:`millstream.schema_unification.unify` with the one before)."""
    txn.set(window_schema_key(mapper_index), schema.serialize().to_pybytes())
