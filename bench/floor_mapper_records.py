"""What an exactly-once mapper adds to the store, done by a reader of
:mod:`bench.latency_floor` (``--delivery exactly_once``).

An exactly-once mapper records every batch's boundaries before any of its rows reaches the
window (:meth:`~millstream.workers.mapper_worker.ingest.Ingestion.plan_batch`): one write
transaction per read with rows, which also checks the persisted state, and which the rows
wait for. At each trim it writes its persisted state and clears the batch plans below it
(:meth:`~millstream.workers.mapper_worker.trim.InputTrim.trim_input_rows`). A reader here
makes the same transactions through the same functions, under the prefix of
:mod:`bench.latency`'s processor, so that keys and values have the sizes they have there.
What it leaves out is what both deliveries do alike (the reducers' state records, the
claims check), or what only at-least-once does (the numbering owner).
"""

from __future__ import annotations

import time
import uuid

from millstream.ledger import (
    MapperState,
    clear_batch_plans,
    read_mapper_state,
    write_mapper_state,
)
from millstream.ledger.subspaces import processor_prefix
from millstream.state import StoreTransaction, open_store
from millstream.workers.fencing import check_mapper_state
from millstream.workers.mapper_worker.ingest import record_batch_plan

from bench.queue_pipeline import PROCESSOR_NAME


class MapperRecords:
    """One partition's exactly-once mapper records, kept by the reader of that partition.

    Args:
        url: The store's URL.
        partition: The partition (the mapper's index in :mod:`bench.latency`).
        synchronous: ``"normal"``: commit the records without an fsync of their own (the
            embedded store only; a what-if: the next fsync'd commit in the store's log makes
            them durable, and every reducer commit of their rows comes after them).
    """

    def __init__(self, url: str, partition: int, *, synchronous: str = "full") -> None:
        if synchronous != "full":
            if not url.startswith("sqlite:"):
                raise ValueError(
                    f"synchronous={synchronous!r} is a setting of the embedded store only; "
                    f"{url!r} is not a sqlite:// URL"
                )
            url += ("&" if "?" in url else "?") + f"synchronous={synchronous}"
        self.store = open_store(url, prefix=processor_prefix(PROCESSOR_NAME))
        self.partition = partition
        self.guid = uuid.uuid4().hex
        with self.store.read() as txn:
            self.persisted = read_mapper_state(txn, partition)
        self.plan_seconds: list[float] = []
        """How long each batch's record took: what its rows waited for."""

    def _verify(self, txn: StoreTransaction) -> None:
        check_mapper_state(txn, self.partition, self.guid, self.persisted, at_least_once=False)

    def plan(self, begin: int, end: int) -> None:
        """Record the batch of input rows ``[begin, end)``: the mapper's transaction before
        the batch's rows reach its window.

        Raises:
            RuntimeError: Another end was recorded for ``begin`` (a second reader).
        """
        started = time.perf_counter()
        recorded = record_batch_plan(self.store, self.partition, begin, end, self._verify)
        self.plan_seconds.append(time.perf_counter() - started)
        if recorded != end:
            raise RuntimeError(
                f"partition {self.partition}: the batch at {begin} was recorded to end at "
                f"{recorded}, not {end}; is another floor reader running on this store?"
            )

    def persist(self, position: int, token: bytes) -> None:
        """Persist the state at ``position`` (every row before it committed) and clear the
        batch plans below it: the mapper's transaction before it trims its input."""

        def write(txn: StoreTransaction) -> MapperState:
            self._verify(txn)
            local = MapperState(position, position, token, self.persisted.version)
            written = write_mapper_state(txn, self.partition, local)
            clear_batch_plans(txn, self.partition, position)
            return written

        self.persisted = self.store.transact(write)

    def close(self) -> None:
        """Close the store connection."""
        self.store.close()
