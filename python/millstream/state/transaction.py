"""A transaction of the store: the interface every backend implements.

The public methods take tuple keys, pack them under the store's prefix, enforce
FoundationDB's limits and keep the size accounting; backends implement the ``_raw_*``
methods on packed byte keys.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.exceptions import ConfigurationError
from millstream.state.keys import (
    SLOT_BYTES,
    Key,
    encode_keys,
    key_bytes,
    longest_key,
    pack,
    range_of,
    unpack,
    wrap_int64,
)
from millstream.state.limits import (
    clear_bytes,
    clear_range_bytes,
    read_bytes,
    read_range_bytes,
    write_bytes,
)

if TYPE_CHECKING:
    from millstream.state.store import Store

SORT_THRESHOLD = 1024
"""Batches at least this long are written in key order (B-tree friendly, about 35% faster)."""


def _key_order(keys: pa.Array) -> pa.Array | None:
    """Stable sort indices that put ``keys`` in tuple-layer order, if cheap to compute.

    For integers, strings and binaries the tuple encoding preserves Arrow's order.
    """
    kind = keys.type
    if len(keys) < SORT_THRESHOLD or not (
        pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    ):
        return None
    order: pa.Array = pc.sort_indices(keys)
    return order


def _delta_columns(
    deltas: pa.Array | pa.ChunkedArray | Sequence[int] | pa.RecordBatch | pa.Table,
) -> list[pa.Array]:
    """The columns of :meth:`StoreTransaction.add_many`'s ``deltas``: one, or one per lane."""
    if isinstance(deltas, pa.RecordBatch | pa.Table):
        if deltas.num_columns == 0:
            raise ValueError("add_many got deltas without columns; give at least one")
        return [_as_array(column) for column in deltas.columns]
    return [_as_array(deltas)]


def _as_array(values: pa.Array | pa.ChunkedArray | Sequence[Any]) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    return pa.array(values)


class StoreTransaction(ABC):
    """One transaction: reads see a consistent snapshot plus this transaction's own writes.

    Writes are applied atomically by :meth:`commit`, which fails with
    :class:`~millstream.exceptions.StoreConflictError` if anything this transaction read
    (without ``snapshot=True``) changed in the meantime. Atomic adds do not read, so
    concurrent adds to one key never conflict. Keys are tuples relative to the store's
    prefix; values are bytes.

    A transaction is used by one thread at a time.

    Args:
        store: The store the transaction belongs to.
        splittable: Its caller splits its work over several transactions when it is too
            large (a reducer's commit of several rows fetches fewer next time), so it is
            held to the limit by :attr:`commit_size`, the backend's own count, rather
            than by FoundationDB's.
    """

    def __init__(self, store: Store, *, splittable: bool = False) -> None:
        self._store = store
        self._prefix = store.prefix_bytes
        self._limits = store.limits
        self._clock = store.clock
        self._started: float | None = None
        self._size = 0
        self._stored = 0
        self._by_stored = splittable and not store.limits_transaction_size
        self._wakes: set[bytes] = set()

    # -- bookkeeping -------------------------------------------------------------------

    @property
    def write_size(self) -> int:
        """The transaction's size so far in bytes as FoundationDB counts it (what it may
        not pass on FoundationDB; see :mod:`millstream.state.limits`)."""
        return self._size

    @property
    def commit_size(self) -> int:
        """The size this transaction is held to the limit by: :attr:`write_size`, except
        for a ``splittable`` one on a backend without a size limit of its own (SQLite),
        where it is the bytes stored: keys and values written, keys read and range bounds
        (what a reducer sizes its commits of several rows by)."""
        return self._stored if self._by_stored else self._size

    @property
    def store(self) -> Store:
        """The store this transaction belongs to."""
        return self._store

    def _start(self) -> None:
        """Note the first operation; reads past the time limit fail (as on FoundationDB)."""
        now = self._clock()
        if self._started is None:
            self._started = now
        else:
            self._limits.check_age(now - self._started)

    def _start_write(self) -> None:
        if self._started is None:
            self._started = self._clock()

    def _grow(self, size: int, stored: int) -> None:
        """Count an operation: ``size`` bytes as FoundationDB counts it, ``stored`` bytes
        of keys and values."""
        self._size += size
        self._stored += stored
        self._limits.check_size(self._stored if self._by_stored else self._size)

    def _key(self, key: Key) -> bytes:
        raw = self._prefix + pack(key)
        self._limits.check_key(raw)
        return raw

    def _bounds(self, begin: Key, end: Key) -> tuple[bytes, bytes]:
        b = self._prefix + pack(begin)
        e = self._prefix + pack(end)
        return b, e

    def _batch_keys(self, keyspace: Key, keys: pa.Array | Sequence[Any]) -> Sequence[bytes]:
        raw = encode_keys(self._prefix + pack(keyspace), keys)
        if raw:
            self._limits.check_key(longest_key(raw))
        return raw

    # -- reads ------------------------------------------------------------------------

    def get(self, key: Key, *, snapshot: bool = False) -> bytes | None:
        """Read one key; ``None`` if absent.

        Args:
            key: The key, relative to the store's prefix.
            snapshot: Read without adding a read conflict (a later change by another
                transaction does not make this one fail).
        """
        self._start()
        raw = self._key(key)
        if not snapshot:
            self._grow(read_bytes(1, len(raw)), len(raw))
        return self._raw_get(raw, snapshot)

    def get_many(
        self, keyspace: Key, keys: pa.Array | Sequence[Any], *, snapshot: bool = False
    ) -> list[bytes | None]:
        """Read ``keyspace + (keys[i],)`` for every i, in one batch.

        Args:
            keyspace: Tuple prefix shared by the keys.
            keys: Arrow array (or sequence) of key elements: ints, strings or binaries.
            snapshot: Read without adding read conflicts.

        Returns:
            The values, aligned with ``keys``; ``None`` where absent.
        """
        self._start()
        return self._read_batch(list(self._batch_keys(keyspace, keys)), snapshot)

    def get_each(self, keys: Sequence[Key], *, snapshot: bool = False) -> list[bytes | None]:
        """Read several unrelated keys at once: a store over the network sends their reads
        together (one round trip where :meth:`get` after :meth:`get` takes one each).

        Args:
            keys: The keys, each relative to the store's prefix.
            snapshot: Read without adding read conflicts.

        Returns:
            The values, aligned with ``keys``; ``None`` where absent.
        """
        self._start()
        return self._read_batch([self._key(key) for key in keys], snapshot)

    def _read_batch(self, raw: list[bytes], snapshot: bool) -> list[bytes | None]:
        """The batch reads' common part: count what a conflict-checked read adds to the
        transaction, then read ``raw`` keys in one call."""
        if not snapshot:
            size = key_bytes(raw)
            self._grow(read_bytes(len(raw), size), size)
        return self._raw_get_many(raw, snapshot)

    def get_range(
        self,
        begin: Key,
        end: Key,
        limit: int = 0,
        reverse: bool = False,
        *,
        snapshot: bool = False,
    ) -> list[tuple[Key, bytes]]:
        """Read the keys in ``[begin, end)`` in key order.

        Args:
            begin: First key (inclusive).
            end: End key (exclusive).
            limit: Return at most this many pairs; 0 means no limit.
            reverse: Return pairs in descending key order (with ``limit``: the last ones).
            snapshot: Read without adding a read conflict.

        Returns:
            ``(key, value)`` pairs, keys relative to the store's prefix.
        """
        self._start()
        b, e = self._bounds(begin, end)
        return self._decoded_range(b, e, limit, reverse, snapshot)

    def get_range_startswith(
        self, prefix: Key, limit: int = 0, reverse: bool = False, *, snapshot: bool = False
    ) -> list[tuple[Key, bytes]]:
        """Read every key that extends the tuple ``prefix`` (not ``prefix`` itself).

        Args:
            prefix: The tuple prefix, e.g. ``("counts",)``.
            limit: Return at most this many pairs; 0 means no limit.
            reverse: Return pairs in descending key order.
            snapshot: Read without adding a read conflict.
        """
        self._start()
        b, e = range_of(prefix)
        return self._decoded_range(self._prefix + b, self._prefix + e, limit, reverse, snapshot)

    def _decoded_range(
        self, b: bytes, e: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[tuple[Key, bytes]]:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if b >= e:
            return []
        if not snapshot:
            self._grow(read_range_bytes(len(b), len(e)), len(b) + len(e))
        n = len(self._prefix)
        return [(unpack(k[n:]), v) for k, v in self._raw_get_range(b, e, limit, reverse, snapshot)]

    # -- writes -----------------------------------------------------------------------

    def set(self, key: Key, value: bytes) -> None:
        """Write ``value`` at ``key``."""
        self._start_write()
        raw = self._key(key)
        if not isinstance(value, bytes):
            raise TypeError(f"values are bytes; got {type(value).__name__}")
        self._limits.check_value(raw, len(value))
        self._grow(write_bytes(1, len(raw), len(value)), len(raw) + len(value))
        self._raw_set(raw, value)

    def set_many(
        self,
        keyspace: Key,
        keys: pa.Array | Sequence[Any],
        values: pa.Array | Sequence[bytes],
    ) -> None:
        """Write ``values[i]`` at ``keyspace + (keys[i],)`` for every i, in one batch.

        Args:
            keyspace: Tuple prefix shared by the keys.
            keys: Arrow array (or sequence) of key elements.
            values: Arrow binary array (or sequence of bytes) aligned with ``keys``.
        """
        self._start_write()
        key_array = _as_array(keys)
        array = _as_array(values)
        if len(array) != len(key_array):
            raise ValueError(f"set_many got {len(key_array)} keys but {len(array)} values")
        order = _key_order(key_array)
        if order is not None:
            key_array, array = key_array.take(order), array.take(order)
        raw = list(self._batch_keys(keyspace, key_array))
        if array.null_count:
            raise ConfigurationError("set_many values must not contain nulls; use clear")
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise TypeError(f"set_many values must be a binary array; got {array.type}")
        if raw:
            lengths = pc.binary_length(array)
            longest = pc.max(lengths).as_py()
            if longest > self._limits.max_value_bytes:
                index = pc.index(lengths, longest).as_py()
                self._limits.check_value(raw[index], longest)
            size, stored = key_bytes(raw), pc.sum(lengths).as_py()
            self._grow(write_bytes(len(raw), size, stored), size + stored)
        self._raw_set_many(raw, array.to_pylist())

    def clear(self, key: Key) -> None:
        """Delete ``key`` (no error if absent)."""
        self._start_write()
        raw = self._key(key)
        self._grow(clear_bytes(1, len(raw)), len(raw))
        self._raw_clear(raw)

    def clear_range(self, begin: Key, end: Key) -> None:
        """Delete every key in ``[begin, end)``."""
        self._start_write()
        b, e = self._bounds(begin, end)
        if b < e:  # an empty range is not sent, so not counted
            self._grow(clear_range_bytes(len(b), len(e)), len(b) + len(e))
            self._raw_clear_range(b, e)

    def clear_range_startswith(self, prefix: Key) -> None:
        """Delete every key that extends the tuple ``prefix`` (not ``prefix`` itself)."""
        self._start_write()
        b, e = range_of(prefix)
        b, e = self._prefix + b, self._prefix + e
        self._grow(clear_range_bytes(len(b), len(e)), len(b) + len(e))
        self._raw_clear_range(b, e)

    def add(self, key: Key, delta: int) -> None:
        """Atomically add ``delta`` to the little-endian int64 at ``key`` (FoundationDB ADD).

        An absent key counts as 0; the sum wraps around in 64 bits. Adding does not read, so
        it never causes a conflict. Decode the value with
        :func:`~millstream.state.decode_int64`.
        """
        self._start_write()
        raw = self._key(key)
        self._grow(write_bytes(1, len(raw), 8), len(raw) + 8)
        self._raw_add(raw, wrap_int64(int(delta)))

    def add_many(
        self,
        keyspace: Key,
        keys: pa.Array | Sequence[Any],
        deltas: pa.Array | Sequence[int] | pa.RecordBatch | pa.Table,
    ) -> None:
        """Atomically add ``deltas[i]`` to ``keyspace + (keys[i],)`` for every i.

                The batch form of :meth:`add` for reducers folding many keys into their state. Keys
                may repeat; every delta is added.

                Several counters per key go in one call as int columns (a ``RecordBatch`` or
                ``Table``): each key then holds one value with one int64 per column, its *lanes*,
                little-endian and back to back, and the columns are added lane by lane (each lane
                wraps around in 64 bits like :meth:`add`; a stored value of another width is first
                cut or zero-extended to this one's). One stored entry per key instead of one per
                counter: a fraction of the bytes a commit writes. Read them back with
        :func:`~millstream.state.decode_int64s`. Like :meth:`add`, lanes are added
                without a read and never conflict: on SQLite in the commit, on FoundationDB by one
                atomic ``ADD`` per key, each lane in a 16-byte slot that keeps its carries
                (:data:`~millstream.state.keys.SLOT_BYTES`; the value is then ``16 * lanes + 1``
                bytes, which ``decode_int64s`` reads).

                Args:
                    keyspace: Tuple prefix shared by the keys.
                    keys: Arrow array (or sequence) of key elements: ints, strings or binaries.
                    deltas: Arrow int array (or sequence of ints) aligned with ``keys``, or int
                        columns aligned with it (one lane per column).
        """
        self._start_write()
        key_array = _as_array(keys)
        columns = _delta_columns(deltas)
        for column in columns:
            if len(column) != len(key_array):
                raise ValueError(f"add_many got {len(key_array)} keys but {len(column)} deltas")
            if column.null_count:
                raise ConfigurationError("add_many deltas must not contain nulls")
            if not pa.types.is_integer(column.type):
                raise TypeError(f"add_many deltas must be integers; got {column.type}")
        order = _key_order(key_array)
        if order is not None:
            key_array = key_array.take(order)
            columns = [column.take(order) for column in columns]
        raw = self._batch_keys(keyspace, key_array)
        width = 8 * len(columns)
        if raw:
            # What FoundationDB stores (and counts): a slot per lane past one (SLOT_BYTES).
            stored = width if len(columns) == 1 else SLOT_BYTES * len(columns) + 1
            self._limits.check_value(raw[0], stored)
            size = key_bytes(raw)
            self._grow(write_bytes(len(raw), size, stored * len(raw)), size + width * len(raw))
        lanes = [column.cast(pa.int64()).to_numpy(zero_copy_only=False) for column in columns]
        if len(lanes) == 1:
            self._raw_add_many(raw, lanes[0].tolist())
            return
        packed = np.ascontiguousarray(np.column_stack(lanes), dtype="<i8").tobytes()
        self._raw_add_lanes(raw, [packed[i : i + width] for i in range(0, len(packed), width)])

    def scoped(self, prefix: Key) -> StoreTransaction:
        """This transaction seen under another store prefix of the same database.

        Reads and writes made through the view belong to this transaction (they commit or
        fail with it, and count against its limits); only their keys are packed under
        ``prefix`` instead of this store's. What lets a reducer append to a queue or record
        a sink's file, which live under their own prefixes, atomically with its commit.
        """
        from millstream.state.scoped import ScopedTransaction  # a subclass of this one

        return ScopedTransaction(self, prefix)

    def wake_on_commit(self, key: Key) -> None:
        """Once this transaction commits, wake whoever waits for ``key`` to change
        (:meth:`Store.wait_for`), even when it leaves ``key`` unchanged. The embedded store
        cannot tell other processes of a commit, and a FoundationDB watch fires only when
        the value changes, so a writer that others wait for (a queue's appender, its seal)
        names the keys they watch."""
        self._raw_wake(self._key(key))

    def _raw_wake(self, key: bytes) -> None:
        self._wakes.add(key)

    def _committed(self) -> None:
        """After a commit: wake the waiters of the keys named by :meth:`wake_on_commit`."""
        if self._wakes:
            wakes, self._wakes = self._wakes, set()
            self._store._wake(wakes)

    # -- lifecycle ----------------------------------------------------------------------

    def commit(self) -> None:
        """Apply every write atomically.

        Raises:
            StoreConflictError: Something this transaction read changed; retry it.
            CommitUnknownResultError: The commit may or may not have happened (FoundationDB);
                run the transaction again only if it is idempotent (:meth:`Store.transact`
                does so for bodies declared ``idempotent=True``), else read whether it
                landed first.
            TransactionTooOldError: The transaction ran longer than five seconds.
            StoreUnavailableError: The store cannot be reached or stays locked.
        """
        if self._started is not None:
            self._limits.check_age(self._clock() - self._started)
        self._raw_commit()
        self._committed()

    def reset(self) -> None:
        """Discard every read and write so the object can be reused as a new transaction."""
        self._started = None
        self._size = 0
        self._stored = 0
        self._wakes = set()
        self._raw_reset()

    # -- backend hooks ------------------------------------------------------------------

    @abstractmethod
    def _raw_get(self, key: bytes, snapshot: bool) -> bytes | None: ...

    @abstractmethod
    def _raw_get_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]: ...

    @abstractmethod
    def _raw_get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[tuple[bytes, bytes]]: ...

    @abstractmethod
    def _raw_set(self, key: bytes, value: bytes) -> None: ...

    @abstractmethod
    def _raw_set_many(self, keys: list[bytes], values: list[bytes]) -> None: ...

    @abstractmethod
    def _raw_clear(self, key: bytes) -> None: ...

    @abstractmethod
    def _raw_clear_range(self, begin: bytes, end: bytes) -> None: ...

    @abstractmethod
    def _raw_add(self, key: bytes, delta: int) -> None: ...

    @abstractmethod
    def _raw_add_many(self, keys: Sequence[bytes], deltas: list[int]) -> None:
        """Add each of ``deltas`` to its key, in order (``keys`` may be
        :class:`~millstream.state.keys.EncodedKeys`: iterate it, or take its array)."""

    @abstractmethod
    def _raw_add_lanes(self, keys: Sequence[bytes], deltas: list[bytes]) -> None:
        """Add each of ``deltas`` (int64 lanes, see :func:`~millstream.state.add_int64s`)
        to its key, in order."""

    @abstractmethod
    def _raw_commit(self) -> None: ...

    @abstractmethod
    def _raw_reset(self) -> None: ...


__all__ = ["SORT_THRESHOLD", "StoreTransaction"]
