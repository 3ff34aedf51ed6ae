"""The input model (thesis 4.2): one replayable, trimmable partition per mapper."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyarrow as pa


@dataclass(frozen=True)
class ReadResult:
    """What one ``PartitionReader.read`` returns.

    Attributes:
        batch: The rows read, numbered from the ``begin_row_index`` passed to ``read``;
            ``None`` or an empty batch when nothing is available yet.
        continuation_token: Where the next read starts (stored in the persisted mapper
            state, so keep it small).
        end_of_input: True when the partition is bounded and every row has been returned;
            a processor over bounded inputs drains and exits.
        caught_up: True when the read returned every row the partition held when it was
            read: a mapper whose reader can wait for rows (:class:`WaitingReader`) then
            waits for the next ones instead of reading again at once, a read that would
            find nothing. A hint: False (the default) is always correct.
    """

    batch: pa.RecordBatch | None
    continuation_token: bytes
    end_of_input: bool = False
    caught_up: bool = False


@runtime_checkable
class PartitionReader(Protocol):
    """Reads one input partition in a deterministic order.

    Rows are numbered in the mapper's input numbering: absolute and gap-free. ``read`` must
    return the same rows for the same ``(begin_row_index, continuation_token)`` every time
    (after a restart too), and ``trim`` must be idempotent.
    """

    def read(
        self, begin_row_index: int, end_row_index_hint: int, continuation_token: bytes
    ) -> ReadResult:
        """Return the rows starting at ``begin_row_index`` / ``continuation_token``;
        ``end_row_index_hint`` bounds how many to return (a hint)."""
        ...

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        """Mark every row below ``row_index`` (before ``continuation_token``) as consumed,
        so it may be deleted. Idempotent; may act asynchronously."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


@runtime_checkable
class WaitingReader(Protocol):
    """A reader that can sleep until rows arrive (optional: readers without it are polled
    every ``Tuning.idle_seconds`` once they have returned every row)."""

    def wait_for_rows(self, begin_row_index: int, timeout_seconds: float) -> None:
        """Return once rows from ``begin_row_index`` may be readable (or the partition
        ended), at most ``timeout_seconds`` later; returning early is harmless (the mapper
        reads, then waits again)."""
        ...


@runtime_checkable
class Input(Protocol):
    """A partitioned input: one partition per mapper. Must pickle (workers are processes)."""

    @property
    def num_partitions(self) -> int:
        """Number of partitions, hence of mappers."""
        ...

    def reader(self, partition: int) -> PartitionReader:
        """A reader of one partition."""
        ...
