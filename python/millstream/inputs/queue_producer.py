"""Idempotent producers of a :class:`~millstream.inputs.StoreQueue` (Kafka's idempotent producer).

A producer has an id and numbers its appends to each partition with increasing sequence
numbers. The transaction that appends the rows also checks and records, under the
partition, the producer's last sequence number and the rows it appended then. So:

- an append whose commit outcome is unknown (it may have landed) is retried, finds its
  sequence recorded, and returns the original row range instead of appending again;
- a producer that restarts under the same id resumes after its last sequence
  (:meth:`QueueProducer.last_sequence`), and an append repeated with the sequence it had
  the first time is appended once: the last one returns its original range, older ones
  raise :class:`~millstream.exceptions.DuplicateSequenceError`.

An append larger than one transaction (a few MB) is written in several, its *pieces*, and
the rows of each piece are readable once it lands. The rule: a sequence counts as
appended (:meth:`QueueProducer.last_sequence`) only once every piece landed. An append
that stopped between pieces (an error, a crash) is completed by appending that sequence
again with the same rows: the pieces that landed are skipped and the others land once,
after the rows readers may have read already, which never change. Until it is completed,
the producer's other appends to the partition raise
:class:`~millstream.exceptions.InputError` (so is one with other rows under that
sequence, which a digest of its rows tells); a producer that resumes at
``last_sequence(p) + 1`` with the rows it had for each sequence completes it by itself.

Sequence numbers need not be consecutive, only increasing (a source offset works). One
producer id must be used by one producer at a time, as in Kafka.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from millstream.exceptions import ConfigurationError, DuplicateSequenceError, InputError
from millstream.state.keys import Key, unpack

if TYPE_CHECKING:
    from millstream.inputs.store_queue import StoreQueue

MAX_PRODUCER_ID_CHARS = 200
"""Longest producer id (it is part of a key; FoundationDB keys stay under 10 kB)."""


class QueueProducer:
    """Appends to a :class:`~millstream.inputs.StoreQueue` exactly once per sequence number.

    Get one with :meth:`StoreQueue.producer`. Appends of one producer object are
    serialized; use one producer id per producing process or thread.

    Args:
        queue: The queue appended to.
        producer_id: A name that stays the same across the producer's restarts.
    """

    def __init__(self, queue: StoreQueue, producer_id: str) -> None:
        if not isinstance(producer_id, str) or not producer_id:
            raise ConfigurationError(f"producer_id must be a non-empty str, got {producer_id!r}")
        if len(producer_id) > MAX_PRODUCER_ID_CHARS:
            raise ConfigurationError(
                f"producer_id has {len(producer_id)} characters; at most "
                f"{MAX_PRODUCER_ID_CHARS} (it is part of a store key)"
            )
        self._queue = queue
        self._id = producer_id
        self._last: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def producer_id(self) -> str:
        """The producer's id."""
        return self._id

    @property
    def queue(self) -> StoreQueue:
        """The queue appended to."""
        return self._queue

    def last_sequence(self, partition: int) -> int:
        """The last sequence number this producer id appended to ``partition`` whole
        (-1: none).

        Read from the store, so a restarted producer resumes at ``last_sequence(p) + 1``,
        with the same rows for each sequence as before: a sequence after it that landed in
        part (an append of several transactions that stopped between them) is completed
        then, once (see the module docstring).
        """
        return self._queue.producer_sequence(partition, self._id)

    def append(
        self, partition: int, batch: pa.RecordBatch | pa.Table, *, sequence: int | None = None
    ) -> tuple[int, int]:
        """Append rows to a partition once, however often this call is repeated.

        Args:
            partition: The queue partition.
            batch: The rows.
            sequence: This append's sequence number, above every earlier one of this
                producer in this partition. Default: one above the last (read from the
                store on the first append). An append that raised may or may not have
                landed, or only in part: to retry its rows, repeat it with the same
                ``sequence`` (and the same rows).

        Returns:
            ``(begin_row_index, end_row_index)`` of the rows: the original range when this
            sequence was appended before and is the producer's last one.

        Raises:
            DuplicateSequenceError: ``sequence`` is below the producer's last one in this
                partition: the rows were appended before.
            InputError: The schema differs from the partition's, the partition is sealed,
                or an earlier sequence landed in part and must be completed first.
        """
        with self._lock:
            if sequence is None:
                last = self._last.get(partition)
                if last is None:
                    last = self.last_sequence(partition)
                sequence = last + 1
            if sequence < 0:
                raise ValueError(f"sequence numbers are >= 0, got {sequence}")
            # Whatever happens, never reuse this number for other rows: if this append
            # raised, its commit may still land.
            self._last[partition] = max(self._last.get(partition, -1), sequence)
            return self._queue.append_as(partition, batch, self._id, sequence)


@dataclass(frozen=True)
class Admitted:
    """What a producer's record says of an append's piece (see
    :meth:`ProducerRecord.admit`)."""

    retry: tuple[int, int] | None
    """The piece landed before: the row range to return, nothing to write."""
    first_begin: int | None
    """The first row of the sequence's first piece, when earlier pieces landed."""
    complete: int
    """The producer's last sequence that landed whole, before this piece."""


class ProducerRecord:
    """A producer's record in a queue partition: its last ``(sequence, piece, begin, end,
    pieces, complete, digest)``. ``pieces`` is how many transactions the sequence's append
    takes, ``complete`` the producer's last sequence whose every piece landed, and
    ``digest`` identifies the rows of a sequence of several pieces (:func:`rows_digest`;
    empty for one piece). Records of earlier versions hold the first four only (appends
    of one piece, or complete)."""

    def __init__(self, raw: bytes) -> None:
        values = unpack(raw)
        self.sequence, self.piece, self.begin, self.end = (int(v) for v in values[:4])
        if len(values) > 4:
            self.pieces, self.complete = int(values[4]), int(values[5])
            self.digest = bytes(values[6])
        else:  # written before appends of several pieces were recorded as such
            self.pieces, self.complete, self.digest = self.piece + 1, self.sequence, b""

    @property
    def partial(self) -> bool:
        """Whether the last sequence landed in part (some of its pieces are missing)."""
        return self.piece < self.pieces - 1

    def admit(self, where: str, sequence: int, piece: int, digest: bytes) -> Admitted:
        """Check piece ``piece`` of ``sequence`` (rows ``digest``) against the record.

        Raises:
            InputError: The last sequence landed in part and this is not its next piece
                with the same rows.
            DuplicateSequenceError: ``sequence`` is below the last one.
        """
        last = self.sequence
        if self.partial and (sequence != last or digest != self.digest):
            other = "other rows as " if sequence == last else ""
            raise InputError(
                f"{where} appended sequence {last} in part ({self.piece + 1} of its "
                f"{self.pieces} transactions, rows [{self.begin}, {self.end}) landed), so it "
                f"cannot append {other}sequence {sequence}; append sequence {last} again "
                "with the same rows to complete it first"
            )
        if sequence < last:
            raise DuplicateSequenceError(
                f"{where} appended sequence {last} already, so sequence {sequence} was "
                f"appended before; resume at sequence {last + 1}",
                last_sequence=last,
            )
        if sequence == last and (piece <= self.piece or not self.partial):
            return Admitted((self.begin, self.end), None, self.complete)
        if sequence == last:
            return Admitted(None, self.begin, self.complete)
        return Admitted(None, None, last)


def refuse_partial(records: list[tuple[Key, bytes]], where: str) -> None:
    """Raise if one of the producer ``records`` (key, record) of a partition holds a
    sequence that landed in part: sealing the partition then would lose its other rows.
    Anonymous producers (:meth:`StoreQueue.append`, ids from ``~``) do not complete."""
    for key, raw in records:
        record = ProducerRecord(raw)
        if record.partial and not str(key[-1]).startswith("~"):
            raise InputError(
                f"{where}: producer {key[-1]!r} appended sequence {record.sequence} in part "
                f"({record.piece + 1} of its {record.pieces} transactions); append it again "
                "with the same rows to complete it before sealing the partition"
            )


def rows_digest(schema_ipc: bytes, pieces: list[list[tuple[int, bytes]]]) -> bytes:
    """What identifies the rows of an append of several pieces (``(rows, payload)``
    chunks each): an append that completes one stopped between pieces must bring the
    same rows."""
    digest = hashlib.blake2b(schema_ipc, digest_size=16)
    for piece in pieces:
        digest.update(len(piece).to_bytes(8, "little"))
        for rows, payload in piece:
            digest.update(rows.to_bytes(8, "little"))
            digest.update(len(payload).to_bytes(8, "little"))
            digest.update(payload)
    return digest.digest()


__all__ = [
    "MAX_PRODUCER_ID_CHARS",
    "Admitted",
    "ProducerRecord",
    "QueueProducer",
    "refuse_partial",
    "rows_digest",
]
