"""Straggler spill records (thesis section 6): a mapper's rows for a reducer that fell
behind, kept in the store until that reducer commits them.

A mapper whose window is full while most reducers have moved on writes the rows the others
still wait for as chunks under ``("spill", reducer, mapper, last shuffle index)``, each an
Arrow IPC stream whose last column (``millstream._core.SHUFFLE_INDEX_COLUMN``) holds every
row's shuffle index, and lets its window go of them. The reducer reads its chunks before
the mapper's window rows, skips what it committed already, and clears the chunks it
consumed in the transaction that commits them.
"""

from __future__ import annotations

from millstream.ledger.subspaces import SYSTEM
from millstream.state.keys import Key
from millstream.state.transaction import StoreTransaction

__all__ = [
    "clear_spill",
    "read_spill",
    "spill_key",
    "spill_pending",
    "spilled_through",
    "write_spill_chunk",
]


def spill_key(reducer_index: int, mapper_index: int, last_shuffle_row_index: int) -> Key:
    """The key of a spilled chunk of ``mapper_index``'s rows for ``reducer_index``."""
    return (*SYSTEM, "spill", reducer_index, mapper_index, last_shuffle_row_index)


def write_spill_chunk(
    txn: StoreTransaction,
    reducer_index: int,
    mapper_index: int,
    last_shuffle_row_index: int,
    arrow_ipc: bytes,
) -> None:
    """Record one chunk (rewriting the same chunk is harmless: same rows, same key)."""
    txn.set(spill_key(reducer_index, mapper_index, last_shuffle_row_index), arrow_ipc)


def read_spill(
    txn: StoreTransaction,
    reducer_index: int,
    mapper_index: int,
    after: int,
    max_bytes: int,
) -> tuple[list[tuple[int, bytes]], bool]:
    """Chunks holding rows after shuffle index ``after``, in order, about ``max_bytes`` of
    them (at least one).

    Returns:
        ``(last shuffle index, Arrow IPC)`` per chunk, and whether those are all there are.
    """
    begin = spill_key(reducer_index, mapper_index, after + 1)
    end = (*SYSTEM, "spill", reducer_index, mapper_index + 1)
    out: list[tuple[int, bytes]] = []
    size = 0
    while True:
        page = txn.get_range(begin, end, limit=64)
        for key, value in page:
            if out and size + len(value) > max_bytes:
                return out, False
            out.append((int(key[-1]), value))
            size += len(value)
        if len(page) < 64:
            return out, True
        begin = spill_key(reducer_index, mapper_index, out[-1][0] + 1)


def spilled_through(txn: StoreTransaction, reducer_index: int, mapper_index: int) -> int:
    """The highest shuffle index spilled and not yet consumed (-1: none)."""
    last = txn.get_range(
        spill_key(reducer_index, mapper_index, -1),
        (*SYSTEM, "spill", reducer_index, mapper_index + 1),
        limit=1,
        reverse=True,
    )
    return int(last[0][0][-1]) if last else -1


def spill_pending(txn: StoreTransaction, reducer_index: int) -> bool:
    """Whether any chunk waits for ``reducer_index`` (a cheap check, no read conflict)."""
    return bool(txn.get_range_startswith((*SYSTEM, "spill", reducer_index), limit=1, snapshot=True))


def clear_spill(txn: StoreTransaction, reducer_index: int, mapper_index: int, through: int) -> None:
    """Remove the chunks whose rows are all at or below shuffle index ``through``."""
    txn.clear_range(
        spill_key(reducer_index, mapper_index, -1),
        spill_key(reducer_index, mapper_index, through + 1),
    )
