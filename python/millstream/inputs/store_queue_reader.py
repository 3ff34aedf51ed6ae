"""One partition of a store queue read as a mapper reads its input (a
:class:`~millstream.inputs.base.PartitionReader` by absolute row index)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from millstream.exceptions import InputError
from millstream.inputs.base import ReadResult
from millstream.state.keys import unpack

if TYPE_CHECKING:
    from millstream.inputs.store_queue import StoreQueue

DEFAULT_READ_ROWS = 65_536
"""Rows a read returns when the caller's hint does not bound it."""


class StoreQueueReader:
    """Reads one partition of a :class:`StoreQueue` by absolute row index.

    The continuation token is the tuple-packed next row index; ``end_of_input`` turns true
    only once the partition is sealed and fully read.
    """

    def __init__(self, queue: StoreQueue, partition: int) -> None:
        self._queue = queue
        self._partition = partition

    @property
    def partition(self) -> int:
        """The partition read."""
        return self._partition

    def read(
        self, begin_row_index: int, end_row_index_hint: int, continuation_token: bytes
    ) -> ReadResult:
        """Return rows from ``begin_row_index``, at most up to ``end_row_index_hint``."""
        if continuation_token:
            (token_row,) = unpack(continuation_token)
            if token_row != begin_row_index:
                raise InputError(
                    f"continuation token points at row {token_row} but the read starts at "
                    f"row {begin_row_index}"
                )
        if begin_row_index < 0:
            raise InputError(f"row indices start at 0, got {begin_row_index}")
        hint = end_row_index_hint - begin_row_index
        max_rows = hint if hint > 0 else DEFAULT_READ_ROWS
        return self._queue.read(self._partition, begin_row_index, max_rows)

    def wait_for_rows(self, begin_row_index: int, timeout_seconds: float) -> None:
        """Return once rows from ``begin_row_index`` may be readable, at most
        ``timeout_seconds`` later (see :class:`~millstream.inputs.base.WaitingReader`)."""
        self._queue.wait_for_rows(self._partition, begin_row_index, timeout_seconds)

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        """Delete the rows below ``row_index`` (idempotent)."""
        self._queue.trim(self._partition, row_index)

    def close(self) -> None:
        """Nothing to release: the queue owns the store."""


__all__ = ["DEFAULT_READ_ROWS", "StoreQueueReader"]
