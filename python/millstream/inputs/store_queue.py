"""A partitioned input queue stored in the state store (the analogue of YT's ordered tables).

Producers :meth:`~StoreQueue.append` Arrow record batches to a partition; a mapper reads its
partition by absolute row index through :meth:`~StoreQueue.reader` and trims what its
reducers have committed. Rows are stored as Arrow IPC record-batch messages in chunks
(:mod:`.queue_chunks`), each split over values of at most 100 kB, with the partition's
schema stored once per change: appends may evolve it by safe changes
(:mod:`.queue_schemas`).

Layout under ``QUEUES + (name,)``:

- ``("meta",)``: the number of partitions.
- ``(p, "schema")``: the partition's latest Arrow schema (IPC); earlier ones and the
  unified schema are :mod:`.queue_schemas`' records.
- ``(p, "end")``, ``(p, "first")``: end row index and first untrimmed row index.
- ``(p, "sealed")``: present once :meth:`~StoreQueue.close_partition` was called.
- ``(p, "rows", begin, end, part)``: part ``part`` of the chunk holding rows
  ``[begin, end)``.
- ``(p, "producer", producer_id)``: the producer's last append to the partition
  (:class:`~millstream.inputs.queue_producer.ProducerRecord`), checked and written by
  every append: what makes one retried after an unknown commit result land once.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import Any, NamedTuple

import pyarrow as pa

from millstream.exceptions import (
    ConfigurationError,
    InputError,
    StoreError,
)
from millstream.inputs import queue_producer as producers
from millstream.inputs.base import ReadResult
from millstream.inputs.queue_chunks import encode_chunks
from millstream.inputs.queue_producer import QueueProducer
from millstream.inputs.queue_schemas import QueueSchemas
from millstream.inputs.storable import check_storable
from millstream.inputs.store_queue_reader import StoreQueueReader
from millstream.ledger import QUEUES
from millstream.state.keys import Key, decode_int64, encode_int64, pack
from millstream.state.store import Store
from millstream.state.transaction import StoreTransaction
from millstream.state.url import open_store

PART_BYTES = 90_000
"""Bytes per stored value (below FoundationDB's 100 kB value limit)."""

TRANSACTION_BYTES = 4_000_000
"""Bytes of rows appended or read per transaction (well below the 10 MB limit)."""


_READ_RECORDS = ("first", "end", "sealed", "schema", "schema_from")
"""A partition's records a read needs, read together."""


def _decode_index(raw: bytes | None, default: int = 0) -> int:
    return default if raw is None else decode_int64(raw)


class _Head(NamedTuple):
    """What an append to a partition checks and continues from."""

    sealed: bool
    schema: bytes | None
    end: int


class StoreQueue:
    """A named, partitioned, unbounded queue of Arrow rows in a state store.

    Concurrent appenders to one partition are safe: each append is a transaction that
    claims the next row indices. Every append lands once even when its commit's outcome is
    unknown and it is retried (FoundationDB's ``commit_unknown_result``): :meth:`append`
    numbers each thread's appends under a producer id of its own, and
    :meth:`producer` gives a named producer that also resumes after a restart. The object
    pickles (it reopens its store from the URL), so it can be handed to worker processes as
    a processor input.

    Args:
        store: Store URL (opened here) or an open :class:`Store`.
        name: Queue name, unique within the store prefix.
        num_partitions: Number of partitions; must match what the queue was created with.
        prefix: Store prefix when ``store`` is a URL.
    """

    def __init__(
        self,
        store: str | Store,
        name: str,
        num_partitions: int,
        *,
        prefix: tuple[Any, ...] = (),
    ) -> None:
        if num_partitions < 1:
            raise ConfigurationError(f"num_partitions must be >= 1, got {num_partitions}")
        self._store = open_store(store, prefix=prefix) if isinstance(store, str) else store
        self._name = name
        self._num_partitions = num_partitions
        self._space = (*QUEUES, name)
        self._anonymous = threading.local()
        self._anonymous_ids: list[tuple[str, set[int]]] = []
        self._schemas: dict[int, tuple[bytes, pa.Schema]] = {}
        """Per partition, its stored schema and the schema parsed (see :meth:`_schema`)."""
        self._store.transact(self._check_meta, idempotent=True)

    def __getstate__(self) -> dict[str, Any]:
        # A copy in another process numbers its appends under producer ids of its own.
        state = dict(self.__dict__)
        del state["_anonymous"], state["_anonymous_ids"], state["_schemas"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._anonymous = threading.local()
        self._anonymous_ids = []
        self._schemas = {}

    def _check_meta(self, txn: StoreTransaction) -> None:
        key = (*self._space, "meta")
        raw = txn.get(key)
        if raw is None:
            txn.set(key, encode_int64(self._num_partitions))
        elif decode_int64(raw) != self._num_partitions:
            raise ConfigurationError(
                f"queue {self._name!r} has {decode_int64(raw)} partitions, not "
                f"{self._num_partitions}"
            )

    @property
    def store(self) -> Store:
        """The store holding the queue."""
        return self._store

    @property
    def name(self) -> str:
        """The queue name."""
        return self._name

    @property
    def num_partitions(self) -> int:
        """The number of partitions."""
        return self._num_partitions

    def _key(self, partition: int, *rest: Any) -> tuple[Any, ...]:
        if not 0 <= partition < self._num_partitions:
            raise ValueError(
                f"partition {partition} out of range for queue {self._name!r} "
                f"with {self._num_partitions} partitions"
            )
        return (*self._space, partition, *rest)

    # -- producer -------------------------------------------------------------------------

    def append(self, partition: int, batch: pa.RecordBatch | pa.Table) -> tuple[int, int]:
        """Append rows to a partition, once.

        Batches up to a few MB are appended in one transaction; larger ones in several
        consecutive ones, so concurrent appenders may interleave between those pieces. A
        commit with an unknown outcome is retried without appending the rows twice (each
        thread numbers its appends under a producer id of this object's). If the call
        raises, the rows may or may not be in the queue, or only the first pieces of a
        large batch; to make a retry after a failure or a crash exactly-once too, append
        through a named :meth:`producer` with sequence numbers.

        Returns:
            ``(begin_row_index, end_row_index)`` of the appended rows (first piece's begin,
            last piece's end).

        Raises:
            InputError: The schema is not a safe change of the partition's (naming the
                append, the column and both types; nothing of the batch is appended),
                the partition is sealed, or a column is dictionary-encoded
                (:func:`check_storable`).
        """
        local = self._anonymous
        if not hasattr(local, "producer_id"):
            local.producer_id = f"~{uuid.uuid4().hex}"
            local.sequence = -1
            local.partitions = set()
            self._anonymous_ids.append((local.producer_id, local.partitions))
        local.sequence += 1
        local.partitions.add(partition)
        try:
            return self.append_as(partition, batch, local.producer_id, local.sequence)
        except BaseException:
            # Nothing completes a failed append: the next one goes under a new id.
            del local.producer_id
            raise

    def producer(self, producer_id: str) -> QueueProducer:
        """A producer that appends exactly once per sequence number, across its restarts.

        Args:
            producer_id: A name that stays the same when the producer restarts; one live
                producer per id.
        """
        return QueueProducer(self, producer_id)

    def producer_sequence(self, partition: int, producer_id: str) -> int:
        """The last sequence number ``producer_id`` appended to ``partition`` whole, every
        piece of it (-1: none); see :meth:`QueueProducer.last_sequence`."""
        key = self._key(partition, "producer", producer_id)
        raw = self._store.transact(lambda txn: txn.get(key), idempotent=True)
        return -1 if raw is None else producers.ProducerRecord(raw).complete

    def append_as(
        self,
        partition: int,
        batch: pa.RecordBatch | pa.Table,
        producer_id: str,
        sequence: int,
    ) -> tuple[int, int]:
        """Append rows as append number ``sequence`` of ``producer_id``; see :meth:`producer`.

        Each transaction checks and records the producer's last sequence in the partition,
        so running it again after it landed appends nothing: it is retried even when its
        commit's outcome is unknown. An append of several pieces (transactions) that
        stopped between them is completed by appending the same sequence with the same
        rows again: the pieces that landed are skipped, the others land once.
        """
        check_storable(batch.schema, self._name)
        batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        pieces: list[list[tuple[int, bytes]]] = [[]]
        piece_bytes = 0
        for whole in batches:
            for chunk_rows, payload in encode_chunks(whole):
                if pieces[-1] and piece_bytes + len(payload) > TRANSACTION_BYTES:
                    pieces.append([])
                    piece_bytes = 0
                pieces[-1].append((chunk_rows, payload))
                piece_bytes += len(payload)
        schema_ipc = batch.schema.serialize().to_pybytes()
        digest = producers.rows_digest(schema_ipc, pieces) if len(pieces) > 1 else b""
        begin = end = 0
        for number, piece in enumerate(pieces):

            def append_piece(
                txn: StoreTransaction, piece: list[tuple[int, bytes]] = piece, number: int = number
            ) -> tuple[int, int]:
                return self._append_piece(
                    txn,
                    partition,
                    schema_ipc,
                    piece,
                    producer_id,
                    sequence,
                    number,
                    pieces=len(pieces),
                    digest=digest,
                )

            begin, end = self._store.transact(append_piece, idempotent=True)
        return begin, end

    def _append_piece(
        self,
        txn: StoreTransaction,
        partition: int,
        schema_ipc: bytes,
        chunks: list[tuple[int, bytes]],
        producer_id: str,
        sequence: int,
        piece: int,
        *,
        pieces: int = 1,
        digest: bytes = b"",
    ) -> tuple[int, int]:
        """Append piece ``piece`` of ``pieces`` of ``sequence`` unless it landed before,
        and record it (see the module docstring)."""
        producer_key = self._key(partition, "producer", producer_id)
        head, (raw,) = self._read_head(txn, partition, producer_key)
        first_begin, complete = None, -1
        if raw is not None:
            where = f"queue {self._name!r} partition {partition}: producer {producer_id!r}"
            admitted = producers.ProducerRecord(raw).admit(where, sequence, piece, digest)
            if admitted.retry is not None:
                return admitted.retry  # appended before: this is a retry
            first_begin, complete = admitted.first_begin, admitted.complete
        appender = f"append of producer {producer_id!r} sequence {sequence}"
        begin, row = self._write_rows(txn, partition, head, schema_ipc, chunks, appender)
        first = begin if first_begin is None else first_begin
        if piece == pieces - 1:
            complete = sequence
        txn.set(producer_key, pack((sequence, piece, first, row, pieces, complete, digest)))
        return first, row

    def append_in(
        self, txn: StoreTransaction, partition: int, batch: pa.RecordBatch | pa.Table
    ) -> tuple[int, int]:
        """Append rows inside the caller's transaction: they land if and only if it commits.

        ``txn`` must be a transaction on this queue's database, seen under the queue's
        prefix (``txn.scoped(queue.store.prefix)``). No producer record is written: the
        caller's transaction must itself be one that never lands twice (a reducer's commit,
        which checks and advances its committed indices, is one). All rows go into the one
        transaction, so they count against its size limit.

        Returns:
            ``(begin_row_index, end_row_index)`` of the appended rows.

        Raises:
            InputError: The schema is not a safe change of the partition's, the partition
                is sealed, or a column is dictionary-encoded (:func:`check_storable`).
        """
        self._key(partition)
        check_storable(batch.schema, self._name)
        batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        chunks = [chunk for whole in batches for chunk in encode_chunks(whole)]
        schema_ipc = batch.schema.serialize().to_pybytes()
        head, _ = self._read_head(txn, partition)
        return self._write_rows(txn, partition, head, schema_ipc, chunks, "append in a transaction")

    def _schemas_of(self, partition: int) -> QueueSchemas:
        return QueueSchemas(
            lambda *rest: self._key(partition, *rest),
            f"queue {self._name!r} partition {partition}",
        )

    def _read_head(
        self, txn: StoreTransaction, partition: int, *more: Key
    ) -> tuple[_Head, list[bytes | None]]:
        """What an append checks and continues from (the partition's seal, schema and end)
        and the keys ``more``, read together: one round trip on a store over the network,
        not one per key."""
        sealed, schema, end, *rest = txn.get_each(
            [
                self._key(partition, "sealed"),
                self._key(partition, "schema"),
                self._key(partition, "end"),
                *more,
            ]
        )
        return _Head(sealed is not None, schema, _decode_index(end)), rest

    def _write_rows(
        self,
        txn: StoreTransaction,
        partition: int,
        head: _Head,
        schema_ipc: bytes,
        chunks: list[tuple[int, bytes]],
        appender: str,
    ) -> tuple[int, int]:
        """Check the partition's seal and schema (``head``, read in ``txn``), then store
        ``chunks`` at its end."""
        if head.sealed:
            raise InputError(f"queue {self._name!r} partition {partition} is sealed")
        stored_schema, begin = head.schema, head.end
        if stored_schema is None:
            txn.set(self._key(partition, "schema"), schema_ipc)
        elif stored_schema != schema_ipc:
            self._schemas_of(partition).change(txn, stored_schema, schema_ipc, begin, appender)
        row = begin
        for count, payload in chunks:
            for part, offset in enumerate(range(0, len(payload), PART_BYTES)):
                txn.set(
                    self._key(partition, "rows", row, row + count, part),
                    payload[offset : offset + PART_BYTES],
                )
            row += count
        txn.set(self._key(partition, "end"), encode_int64(row))
        txn.wake_on_commit(self._key(partition, "end"))
        return begin, row

    def close_partition(self, partition: int) -> int:
        """Seal a partition: no more appends; readers report the end of input there.

        Returns:
            The partition's final end row index.

        Raises:
            InputError: A named producer's append of several pieces stopped between them:
                complete it first (see :mod:`millstream.inputs.queue_producer`).
        """

        def seal(txn: StoreTransaction) -> int:
            records = txn.get_range_startswith(self._key(partition, "producer"))
            producers.refuse_partial(records, f"queue {self._name!r} partition {partition}")
            end = _decode_index(txn.get(self._key(partition, "end")))
            txn.set(self._key(partition, "sealed"), encode_int64(end))
            txn.wake_on_commit(self._key(partition, "end"))  # readers waiting there end
            return end

        # Idempotent: sealing again writes the same end (nothing appends after a seal).
        return self._store.transact(seal, idempotent=True)

    # -- consumer -------------------------------------------------------------------------

    def first_row_index(self, partition: int) -> int:
        """The first row not trimmed."""
        return self._store.transact(
            lambda txn: _decode_index(txn.get(self._key(partition, "first"), snapshot=True)),
            idempotent=True,
        )

    def end_row_index(self, partition: int) -> int:
        """One past the last appended row."""
        return self._store.transact(
            lambda txn: _decode_index(txn.get(self._key(partition, "end"), snapshot=True)),
            idempotent=True,
        )

    def is_sealed(self, partition: int) -> bool:
        """Whether :meth:`close_partition` was called."""
        return self._store.transact(
            lambda txn: txn.get(self._key(partition, "sealed"), snapshot=True) is not None,
            idempotent=True,
        )

    def _schema(self, partition: int, raw: bytes) -> pa.Schema:
        """A stored schema of the partition, parsed once while it is the one read."""
        known = self._schemas.get(partition)
        if known is None or known[0] != raw:
            known = (raw, pa.ipc.read_schema(pa.py_buffer(raw)))
            self._schemas[partition] = known
        return known[1]

    def _chunk_at(self, txn: StoreTransaction, partition: int, row: int) -> tuple[int, int] | None:
        """``(begin, end)`` of the stored chunk holding ``row``, if any."""
        found = txn.get_range(
            self._key(partition, "rows"),
            self._key(partition, "rows", row + 1),
            limit=1,
            reverse=True,
            snapshot=True,
        )
        if not found:
            return None
        key = found[0][0]
        begin, end = int(key[-3]), int(key[-2])
        return (begin, end) if begin <= row < end else None

    def read(self, partition: int, begin_row_index: int, max_rows: int) -> ReadResult:
        """Read up to ``max_rows`` rows starting at ``begin_row_index`` (see :meth:`reader`).

        Raises:
            InputError: The rows were trimmed, or ``begin_row_index`` is negative.
        """
        return self._store.transact(
            lambda txn: self._read(txn, partition, begin_row_index, max(1, max_rows)),
            idempotent=True,
        )

    def _read(self, txn: StoreTransaction, partition: int, begin: int, max_rows: int) -> ReadResult:
        raw_first, raw_end, sealed_raw, schema_raw, raw_from = txn.get_many(
            self._key(partition), _READ_RECORDS, snapshot=True
        )
        first = _decode_index(raw_first)
        if begin < first:
            raise InputError(
                f"queue {self._name!r} partition {partition}: rows below {first} were trimmed; "
                f"cannot read from row {begin}"
            )
        end = _decode_index(raw_end)
        sealed = sealed_raw is not None
        token = pack((begin,))
        if begin >= end:
            return ReadResult(None, token, end_of_input=sealed and begin >= end)
        stop = min(end, begin + max_rows)
        assert schema_raw is not None
        if raw_from is not None and begin < decode_int64(raw_from):
            # Rows of an earlier schema: read up to where it changes.
            stop = min(stop, decode_int64(raw_from))
            schema_raw, stop = self._schemas_of(partition).span(txn, begin, stop)
        schema = self._schema(partition, schema_raw)
        limit = TRANSACTION_BYTES // PART_BYTES + 1

        def chunks_from(row: int) -> list[tuple[Key, bytes]]:
            return txn.get_range(
                self._key(partition, "rows", row),
                self._key(partition, "rows", stop),
                limit=limit,
                snapshot=True,
            )

        # A read usually starts where an append began (a chunk's first row): its chunks are
        # the rows' range. Otherwise the chunk holding ``begin`` starts below it.
        rows = chunks_from(begin)
        if not rows or int(rows[0][0][-3]) != begin:
            chunk = self._chunk_at(txn, partition, begin)
            if chunk is None:
                raise InputError(
                    f"queue {self._name!r} partition {partition}: row {begin} is missing from "
                    "the store (trimmed concurrently or damaged)"
                )
            rows = chunks_from(chunk[0])
        parts: dict[tuple[int, int], list[bytes]] = {}
        for key, value in rows:
            parts.setdefault((int(key[-3]), int(key[-2])), []).append(value)
        if len(rows) == limit:
            last = next(reversed(parts))
            if len(parts) > 1:
                del parts[last]
            else:
                parts[last] = [
                    v
                    for _, v in txn.get_range_startswith(
                        self._key(partition, "rows", *last), snapshot=True
                    )
                ]
        batches = []
        for (chunk_begin, chunk_end), values in parts.items():
            decoded = pa.ipc.read_record_batch(pa.py_buffer(b"".join(values)), schema)
            if decoded.num_rows != chunk_end - chunk_begin:
                raise InputError(
                    f"queue {self._name!r} partition {partition}: chunk [{chunk_begin}, "
                    f"{chunk_end}) holds {decoded.num_rows} rows"
                )
            lo = max(begin, chunk_begin) - chunk_begin
            hi = min(stop, chunk_end) - chunk_begin
            if hi > lo:
                batches.append(decoded.slice(lo, hi - lo))
        if not batches:
            return ReadResult(None, token, end_of_input=False)
        if len(batches) == 1:
            out = batches[0]
        else:
            out = pa.Table.from_batches(batches, schema).combine_chunks().to_batches()[0]
        after = begin + out.num_rows
        return ReadResult(out, pack((after,)), sealed and after >= end, caught_up=after >= end)

    def wait_for_rows(self, partition: int, begin_row_index: int, timeout_seconds: float) -> None:
        """Return once rows from ``begin_row_index`` may be readable (an append or the seal
        committed), at most ``timeout_seconds`` later: a reader at the end of the partition
        sleeps here instead of polling it."""
        self._store.wait_for(
            self._key(partition, "end"),
            lambda raw: _decode_index(raw) > begin_row_index,
            timeout_seconds,
        )

    def trim(self, partition: int, row_index: int) -> None:
        """Delete the rows below ``row_index``; idempotent, never moves backwards."""

        def trim(txn: StoreTransaction) -> None:
            first = _decode_index(txn.get(self._key(partition, "first")))
            if row_index <= first:
                return
            end = _decode_index(txn.get(self._key(partition, "end"), snapshot=True))
            target = min(row_index, end)
            chunk = self._chunk_at(txn, partition, target)
            below = chunk[0] if chunk is not None else target
            txn.clear_range(self._key(partition, "rows"), self._key(partition, "rows", below))
            self._schemas_of(partition).trim(txn, below)
            txn.set(self._key(partition, "first"), encode_int64(target))

        # Idempotent: after it landed, the first row is at or past row_index.
        self._store.transact(trim, idempotent=True)

    def reader(self, partition: int) -> StoreQueueReader:
        """A :class:`~millstream.inputs.base.PartitionReader` over one partition."""
        self._key(partition)
        return StoreQueueReader(self, partition)

    def close(self) -> None:
        """Forget this object's own producer ids and close the store connections.

        Nothing retries this object's appends any more, so the records that made them
        idempotent are cleared (best effort: a store error leaves them, a few bytes each).
        """
        done, self._anonymous_ids = self._anonymous_ids, []
        keys = [
            self._key(partition, "producer", producer_id)
            for producer_id, partitions in done
            for partition in sorted(partitions)
        ]
        if keys:

            def forget(txn: StoreTransaction) -> None:
                for key in keys:
                    txn.clear(key)

            with contextlib.suppress(StoreError):
                self._store.transact(forget, idempotent=True, max_retries=3)
        self._store.close()


__all__ = ["StoreQueue", "StoreQueueReader"]
