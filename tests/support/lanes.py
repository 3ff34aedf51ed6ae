"""What each backend stores when counter lanes are added: the model the store contract
checks raw values against.

SQLite adds int64s back to back (:func:`millstream.state.add_int64s`). FoundationDB adds an
operand of one 16-byte slot per lane and a byte (``rust/millstream-core/src/lanes.rs``) with
its atomic ``ADD``, whose documented rule is modelled here: the stored value zero-extended
or cut to the operand's length, then both added as one little-endian integer.
"""

from __future__ import annotations

from collections.abc import Sequence

from millstream.state import Store, add_int64s, encode_int64s
from millstream.state.fdb_backend import FdbStore
from millstream.state.keys import SLOT_BYTES


def fdb_add(stored: bytes | None, operand: bytes) -> bytes:
    """FoundationDB's ``ADD`` of ``operand`` to ``stored``."""
    base = (stored or b"")[: len(operand)].ljust(len(operand), b"\x00")
    total = int.from_bytes(base, "little") + int.from_bytes(operand, "little")
    return (total % (1 << (8 * len(operand)))).to_bytes(len(operand), "little")


def slot_operand(deltas: Sequence[int]) -> bytes:
    """The ``ADD`` operand that adds ``deltas`` as FoundationDB's backend lays lanes out."""
    slots = b"".join(encode_int64s([d]).ljust(SLOT_BYTES, b"\x00") for d in deltas)
    return slots + b"\x00"


def add_lanes(store: Store, stored: bytes | None, deltas: Sequence[int]) -> bytes:
    """The value ``store`` holds after adding ``deltas`` (several lanes) to ``stored``."""
    if isinstance(store, FdbStore):
        return fdb_add(stored, slot_operand(deltas))
    return add_int64s(stored, encode_int64s(deltas))
