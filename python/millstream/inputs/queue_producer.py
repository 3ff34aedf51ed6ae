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

Sequence numbers need not be consecutive, only increasing (a source offset works). One
producer id must be used by one producer at a time, as in Kafka.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pyarrow as pa

from millstream.exceptions import ConfigurationError

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
        """The last sequence number this producer id appended to ``partition`` (-1: none).

        Read from the store, so a restarted producer resumes at ``last_sequence(p) + 1``.
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
                landed: to retry its rows, repeat it with the same ``sequence``.

        Returns:
            ``(begin_row_index, end_row_index)`` of the rows: the original range when this
            sequence was appended before and is the producer's last one.

        Raises:
            DuplicateSequenceError: ``sequence`` is below the producer's last one in this
                partition: the rows were appended before.
            InputError: The schema differs from the partition's, or the partition is sealed.
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


__all__ = ["MAX_PRODUCER_ID_CHARS", "QueueProducer"]
