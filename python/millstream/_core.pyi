"""Type stubs of the native module ``millstream._core`` (Rust, PyO3).

This file is the contract between the Rust core and the Python package. Arrow data is
accepted from any object implementing the Arrow PyCapsule interface (``pyarrow.RecordBatch``,
``pyarrow.Array``) and returned as ``pyarrow`` objects.
"""

from typing import Any, final

import pyarrow as pa

__all__ = [
    "SHUFFLE_INDEX_COLUMN",
    "CommittedIndexError",
    "FdbBatch",
    "KafkaOffsetOutOfRangeError",
    "KafkaPartitionReader",
    "KafkaReadError",
    "MemoryLimitError",
    "MillstreamError",
    "SchemaMismatchError",
    "Window",
    "WindowError",
    "WindowSnapshot",
    "__build_profile__",
    "__version__",
    "decode_ipc",
    "hash_keys",
    "hash_partition",
    "hash_partition_ordered",
]

__version__: str
__build_profile__: str

SHUFFLE_INDEX_COLUMN: str
"""The column of a spilled chunk that holds each row's shuffle index."""

class MillstreamError(Exception): ...
class WindowError(MillstreamError): ...
class MemoryLimitError(WindowError): ...
class CommittedIndexError(WindowError): ...
class SchemaMismatchError(WindowError): ...

class KafkaReadError(MillstreamError):
    """Reading a Kafka partition failed (the message names the partition and offset)."""

class KafkaOffsetOutOfRangeError(KafkaReadError):
    """The offset to read is outside the partition's log; ``args`` is ``(message, offset,
    log_start, end)``, the range as the leader told it (-1: unknown)."""

@final
class KafkaPartitionReader:
    """Reads one Kafka topic partition ``read_committed`` over a plain connection, ahead of
    its caller: a thread of its own fetches and decodes while the caller works on what it
    took, holding up to ``read_ahead_bytes`` of decoded records, and sends each fetch before
    it decodes the response to the last. A broken connection or a moved leader is retried
    from the offset after the last response handed over: no record is lost or doubled.

    Batches have every record column (key, value, timestamp, headers, partition, offset),
    the value raw.
    """

    def __new__(
        cls,
        bootstrap_servers: str,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        *,
        client_id: str = "millstream",
        timeout_seconds: float = 10.0,
        max_wait_ms: int = 100,
        fetch_bytes: int = 8 << 20,
        read_ahead_bytes: int = 64 << 20,
    ) -> KafkaPartitionReader:
        """Start reading ``partition`` of ``topic`` at offset ``start``, up to before
        ``end`` (``None``: never stop)."""
    def position(self) -> int:
        """The offset of the next record :meth:`read` returns (or past which it looks)."""
    def ended(self) -> bool:
        """Whether every record before ``end`` was returned."""
    def retrying(self) -> tuple[str, float, int] | None:
        """What the reader's thread is waiting out, if its last attempt failed (a broker
        it cannot reach, a leader that moved): the last error, the seconds since the run of
        failed attempts began, and how many failed; ``None`` when the last got through."""
    def read(self, max_rows: int, wait_seconds: float) -> pa.RecordBatch | None:
        """Up to ``max_rows`` records from :meth:`position` on, waiting up to
        ``wait_seconds`` for the first (GIL released); ``None`` when none came.

        Raises:
            KafkaOffsetOutOfRangeError: The position is outside the partition's log.
            KafkaReadError: A corrupt batch, or an error retrying cannot mend.
        """
    def wait(self, timeout_seconds: float) -> bool:
        """Wait up to ``timeout_seconds`` for a record to read; whether one is there."""

@final
class Window:
    """A mapper's window (thesis 4.3.1): window entries, one bucket per reducer, bucket
    pointer counts and the local mapper state. Thread-safe: the ingestion loop pushes while
    gRPC threads call ``get_rows``. Long operations release the GIL.

    Shuffle indices are absolute; ``committed_row_index`` is the shuffle index of the last row
    a reducer committed (``-1`` before its first commit), as in thesis 4.3.4.
    """

    def __new__(
        cls,
        num_reducers: int,
        memory_limit_bytes: int,
        input_unread_row_index: int = 0,
        shuffle_unread_row_index: int = 0,
        continuation_token: bytes = b"",
        *,
        max_payload_bytes: int = 2**64 - 1,
    ) -> Window:
        """A window with no entries, starting at the persisted mapper state.

        ``max_payload_bytes`` is the largest Arrow IPC stream one ``get_rows`` may return
        (what the transport carries: the gRPC message limit less the response envelope,
        see ``millstream.rpc.calls.max_payload_bytes``); ``push`` refuses a batch with a
        row that alone would exceed it.
        """
    def push(
        self,
        batch: Any,
        reducer_indices: Any,
        input_end_row_index: int,
        continuation_token: bytes,
    ) -> tuple[int, int]:
        """Push one mapped batch as a window entry (thesis 4.3.3 step 6).

        The entry covers input rows ``[input_end of previous entry, input_end_row_index)``;
        its rows get the next shuffle indices, returned as ``(begin, end)``. An empty batch is
        allowed (the input still advances). ``reducer_indices`` is an integer array (int32 or
        uint32 preferred; any width, no nulls) with one reducer index per row. Does not block
        on memory; see ``wait_for_room``. The first batch with rows fixes the window's schema;
        a batch with different fields raises ``SchemaMismatchError``. Rows at or below their
        reducer's highest committed index are dropped (see ``get_rows``).

        Raises:
            WindowError: reducer index out of range, length mismatch, closed window, a row
                larger than ``max_payload_bytes`` (the message names its size).
            MemoryLimitError: the batch alone needs more than ``memory_limit_bytes``.
            SchemaMismatchError: the batch's fields differ from the window's.
        """
    def get_rows(
        self,
        reducer_index: int,
        committed_row_index: int,
        max_rows: int,
        max_bytes: int,
        after_row_index: int | None = None,
        shuffle_indices: bool = False,
    ) -> tuple[int, int, bytes]:
        """GetRows (thesis 4.3.4 steps 2-4): pop the bucket up to ``committed_row_index``,
        trim window entries whose bucket pointer count fell to zero, and return
        ``(row_count, last_shuffle_row_index, arrow_ipc_stream_bytes)`` for up to ``max_rows``
        rows after it, without removing them (no stream, ``b""``, when there are none). The
        stream is at most ``max_bytes`` (and ``max_payload_bytes``) long, counted from the
        rows actually returned, except that one row is returned even when it alone is
        longer than ``max_bytes``. With no rows,
        ``row_count`` is 0 and ``last_shuffle_row_index`` equals ``committed_row_index``.

        ``after_row_index`` (the reducer's fetch position, at or beyond its committed
        index): the rows come from after it instead, and the rows up to it stay buffered
        until committed; with no rows, ``last_shuffle_row_index`` is the larger of the two.
        ``shuffle_indices``: the stream carries each row's shuffle index as a last column,
        ``SHUFFLE_INDEX_COLUMN`` (counted in the byte cap).
        """
    def wait_for_room(self, timeout_seconds: float, reserve_bytes: int = 0) -> bool:
        """Block (GIL released) until ``reserve_bytes`` more would keep buffered bytes at
        most the memory limit (or nothing is buffered), the window is closed, or the
        timeout passes. True when there is room."""
    def local_state(self) -> tuple[int, int, bytes]:
        """``(input_unread_row_index, shuffle_unread_row_index, continuation_token)``
        after trimming (thesis 4.3.5)."""
    def close(self) -> None:
        """Wake every waiter; later pushes fail."""
    def bucket_len(self, reducer_index: int, after_row_index: int | None = None) -> int:
        """Rows buffered for the reducer and not committed (or spilled) by it; with
        ``after_row_index``, only those after it (rows it has not fetched yet)."""
    def peek_spill(
        self, stragglers: list[int], target_bytes: int, max_bytes: int, chunk_bytes: int
    ) -> list[tuple[int, int, int, int, bytes]]:
        """Straggler spill: the rows to write to the store so that the window holds at most
        ``target_bytes``, from the front entries that another reducer has moved past and
        only ``stragglers`` still need, their rows; at most ``max_bytes`` (at least one
        entry's), changing nothing. One tuple per chunk of at most ``chunk_bytes`` (or one
        row): ``(reducer_index, first_shuffle_row_index, last_shuffle_row_index,
        row_count, arrow_ipc)``, the rows with their shuffle indices in the column
        :data:`SHUFFLE_INDEX_COLUMN`. Empty when nothing qualifies."""
    def mark_spilled(self, reducer_index: int, through: int) -> bool:
        """Let go of the reducer's rows up to shuffle index ``through``, written to the
        store: they leave the bucket (the committed index stays) and are never buffered
        again; returns whether entries were trimmed."""
    def spilled_row_index(self, reducer_index: int) -> int:
        """The highest shuffle index spilled for the reducer (-1: none)."""
    def pending_shuffle_indices(self, reducer_index: int) -> list[int]:
        """Shuffle indices of the reducer's pending rows, in order (tests, debugging)."""
    def bucket_pointer_counts(self) -> list[int]:
        """Bucket pointer count of every window entry, front first."""
    def snapshot(self) -> WindowSnapshot:
        """Every figure of the window at one instant, taken under one lock (status and
        metrics read this once per heartbeat)."""

@final
class WindowSnapshot:
    """A window's figures at one instant (``Window.snapshot()``); they agree with each other."""

    @property
    def num_reducers(self) -> int: ...
    @property
    def memory_limit_bytes(self) -> int: ...
    @property
    def max_payload_bytes(self) -> int: ...
    @property
    def buffered_bytes(self) -> int:
        """Memory the entries keep allocated: their Arrow buffers (each allocation once; a
        small slice of larger buffers is copied on push, so it holds only its rows) and
        index."""
    @property
    def buffered_rows(self) -> int: ...
    @property
    def index_bytes(self) -> int:
        """The part of ``buffered_bytes`` that is index (everything but Arrow buffers)."""
    @property
    def num_entries(self) -> int: ...
    @property
    def first_entry_index(self) -> int: ...
    @property
    def input_end_row_index(self) -> int:
        """Input index after the last pushed entry: where the next read starts."""
    @property
    def shuffle_end_row_index(self) -> int:
        """Shuffle index the next pushed row will get."""
    @property
    def input_unread_row_index(self) -> int:
        """The local mapper state's input index (as ``Window.local_state()``)."""
    @property
    def shuffle_unread_row_index(self) -> int:
        """The local mapper state's shuffle index (as ``Window.local_state()``)."""
    @property
    def closed(self) -> bool: ...

@final
class FdbBatch:
    """FoundationDB's batch operations, one C call per key with the GIL released, on the
    transactions of the ``libfdb_c`` the official binding loaded (no link to it at build
    time). Keys and values are Arrow binary arrays (binary, large binary or binary view,
    no nulls); ``transaction`` is an ``fdb.Transaction``'s ``tpointer``, kept alive and
    unused by others during the call. A FoundationDB error raises ``error(code)``, the
    binding's ``fdb.FDBError``; every future is destroyed on every path."""

    def __new__(
        cls,
        *,
        transaction_get: int,
        transaction_set: int,
        transaction_atomic_op: int,
        future_block_until_ready: int,
        future_get_value: int,
        future_destroy: int,
        error: type[Exception],
    ) -> FdbBatch:
        """Calls the C functions at these addresses (those of the loaded ``libfdb_c``, API
        version 730 selected: anything else crashes the process, as with ``ctypes``)."""
    def set_many(self, transaction: int, keys: Any, values: Any) -> None:
        """Write ``values[i]`` at ``keys[i]``."""
    def add_many(self, transaction: int, keys: Any, deltas: bytes) -> None:
        """Atomically add ``deltas[i]`` (8 little-endian bytes each, back to back) to
        ``keys[i]`` (FoundationDB ``ADD``: no read, no conflict)."""
    def add_lanes(self, transaction: int, keys: Any, deltas: bytes, width: int) -> None:
        """Add ``width`` little-endian int64 lanes per key (back to back) to ``keys`` lane
        by lane, as ``millstream.state.keys.add_int64s`` does: repeated keys folded first,
        every key read (a read conflict) and written back; nothing is written when a read
        fails."""
    def get_many(self, transaction: int, keys: Any, snapshot: bool) -> list[bytes | None]:
        """The values at ``keys`` (``None`` where absent), every read in flight at once."""

def hash_partition(batch: Any, key_columns: list[str], num_reducers: int) -> pa.Array:
    """Stable reducer index (int32) for every row from the named key columns; the same in
    every process, platform and release (documented hash, pinned by golden vectors)."""

def hash_partition_ordered(
    batch: Any, key_columns: list[str], num_reducers: int
) -> tuple[pa.Array, pa.Array]:
    """The canonical row order (uint32 row numbers: rows sorted by key hash, equal hashes in
    input order) and the reducer index (int32) of every row in that order."""

def hash_keys(batch: Any, key_columns: list[str]) -> pa.Array:
    """The 64-bit row hash (uint64) behind ``hash_partition``; reducer = (hash * n) >> 64."""

def decode_ipc(payloads: list[bytes]) -> pa.RecordBatch:
    """Decode Arrow IPC stream payloads (from ``Window.get_rows``) and concatenate their rows
    into one record batch. All payloads with rows must have the same fields; payloads without
    rows only contribute their schema, and empty ``bytes`` (a GetRows without rows) are
    skipped. Decoding runs in the Rust core with the GIL released and validates the data
    fully (offsets, UTF-8); with one batch of rows the result's arrays point into the
    payload (no copy). Undecodable payloads or differing fields raise ``MillstreamError``."""
