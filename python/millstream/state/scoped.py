"""A transaction seen under another prefix of the same database (``StoreTransaction.scoped``).

What lets a reducer append to a queue or record a sink's file, which live under their own
prefixes, atomically with its commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from millstream.state.keys import Key, pack
from millstream.state.transaction import StoreTransaction


class ScopedTransaction(StoreTransaction):
    """A view of a transaction under another prefix; see :meth:`StoreTransaction.scoped`."""

    def __init__(self, parent: StoreTransaction, prefix: Key) -> None:
        super().__init__(parent.store)
        self._parent = parent
        self._prefix = pack(prefix)

    @property
    def write_size(self) -> int:
        return self._parent.write_size

    @property
    def commit_size(self) -> int:
        return self._parent.commit_size

    def _start(self) -> None:
        self._parent._start()

    def _start_write(self) -> None:
        self._parent._start_write()

    def _grow(self, size: int, stored: int) -> None:
        self._parent._grow(size, stored)

    def _raw_wake(self, key: bytes) -> None:
        self._parent._raw_wake(key)

    def _raw_get(self, key: bytes, snapshot: bool) -> bytes | None:
        return self._parent._raw_get(key, snapshot)

    def _raw_get_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]:
        return self._parent._raw_get_many(keys, snapshot)

    def _raw_get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[tuple[bytes, bytes]]:
        return self._parent._raw_get_range(begin, end, limit, reverse, snapshot)

    def _raw_set(self, key: bytes, value: bytes) -> None:
        self._parent._raw_set(key, value)

    def _raw_set_many(self, keys: list[bytes], values: list[bytes]) -> None:
        self._parent._raw_set_many(keys, values)

    def _raw_clear(self, key: bytes) -> None:
        self._parent._raw_clear(key)

    def _raw_clear_range(self, begin: bytes, end: bytes) -> None:
        self._parent._raw_clear_range(begin, end)

    def _raw_add(self, key: bytes, delta: int) -> None:
        self._parent._raw_add(key, delta)

    def _raw_add_many(self, keys: Sequence[bytes], deltas: list[int]) -> None:
        self._parent._raw_add_many(keys, deltas)

    def _raw_add_lanes(self, keys: Sequence[bytes], deltas: list[bytes]) -> None:
        self._parent._raw_add_lanes(keys, deltas)

    def _raw_commit(self) -> None:
        raise TypeError("a scoped view does not commit: commit the transaction it views")

    def _raw_reset(self) -> None:
        raise TypeError("a scoped view does not reset: reset the transaction it views")


__all__ = ["ScopedTransaction"]
