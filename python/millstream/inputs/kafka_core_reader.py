"""A topic partition read through the Rust core's reader (``_core.KafkaPartitionReader``:
Kafka's Fetch spoken directly, records decoded into Arrow in a thread of its own, reading
ahead of the mapper): started at the offset a read asks for and started again when a read
asks elsewhere, and its retries reported.

The core's reader waits out what retrying can mend (a broker it cannot reach, a leader
that moved) without returning an error: nothing is skipped, the mapper only sees no rows.
So that an operator sees why, a warning names the error once the retries have gone on for
:data:`RETRY_WARNING_SECONDS` (again every as long while they go on), and a line says when
a fetch got through again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pyarrow as pa

from millstream._core import KafkaPartitionReader

log = logging.getLogger(__name__)

RETRY_WARNING_SECONDS = 5.0
"""How long the reader retries before a warning says so, and how often it repeats."""


@dataclass(frozen=True)
class CoreReaderSettings:
    """How the core's reader reaches the partition and how much it fetches."""

    bootstrap_servers: str
    topic: str
    partition: int
    end: int | None
    """The offset to stop before (``None``: never stop)."""
    client_id: str
    timeout_seconds: float
    fetch_bytes: int
    read_ahead_bytes: int


class CoreReader:
    """One partition through the core's reader (see the module docs)."""

    def __init__(self, settings: CoreReaderSettings) -> None:
        self._settings = settings
        self._reader: KafkaPartitionReader | None = None
        self._warned_at: float | None = None
        """When the last warning that the reader is retrying was logged."""

    def _where(self) -> str:
        return f"topic {self._settings.topic!r} partition {self._settings.partition}"

    def read(
        self, offset: int, max_rows: int, wait_seconds: float
    ) -> tuple[pa.RecordBatch | None, int]:
        """Up to ``max_rows`` records from ``offset`` on (every record column, the value
        raw), waiting up to ``wait_seconds`` for the first (``None`` when none came), and
        the offset after them (or past which the reader looked).

        Raises:
            KafkaOffsetOutOfRangeError: ``offset`` is outside the partition's log.
            KafkaReadError: A corrupt batch, or an error retrying cannot mend.
        """
        if self._reader is None or self._reader.position() != offset:
            self._reader = self._start(offset)
        records = self._reader.read(max_rows, wait_seconds)
        self._report_retrying(self._reader)
        return records, self._reader.position()

    def wait(self, timeout_seconds: float) -> None:
        """Wait up to ``timeout_seconds`` for a record after the position (returns at once
        before the first read)."""
        if self._reader is not None:
            self._reader.wait(timeout_seconds)
            self._report_retrying(self._reader)

    def close(self) -> None:
        """Stop the reader's thread (after its current fetch)."""
        self._reader = None

    def _start(self, offset: int) -> KafkaPartitionReader:
        s = self._settings
        return KafkaPartitionReader(
            s.bootstrap_servers,
            s.topic,
            s.partition,
            offset,
            s.end,
            client_id=s.client_id,
            timeout_seconds=s.timeout_seconds,
            fetch_bytes=s.fetch_bytes,
            read_ahead_bytes=s.read_ahead_bytes,
        )

    def _report_retrying(self, reader: KafkaPartitionReader) -> None:
        retrying = reader.retrying()
        if retrying is None:
            if self._warned_at is not None:
                log.warning("%s: a fetch got through again", self._where())
                self._warned_at = None
            return
        error, seconds, attempts = retrying
        now = time.monotonic()
        if seconds < RETRY_WARNING_SECONDS:
            return
        if self._warned_at is None or now - self._warned_at >= RETRY_WARNING_SECONDS:
            self._warned_at = now
            log.warning(
                "%s: no fetch got through for %.0f s (%d attempts; retrying until one does, "
                "nothing is skipped): %s",
                self._where(),
                seconds,
                attempts,
                error,
            )


__all__ = ["RETRY_WARNING_SECONDS", "CoreReader", "CoreReaderSettings"]
