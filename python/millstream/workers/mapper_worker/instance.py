"""One mapper instance's state: what it was given, what it counts, and the check of its
persisted state that every step that writes makes first."""

from __future__ import annotations

import collections
import logging
import uuid
from typing import TYPE_CHECKING

import pyarrow as pa

from millstream import _core
from millstream.inputs.base import PartitionReader
from millstream.ledger import MapperState
from millstream.state import Store, StoreTransaction
from millstream.workers.clock import SYSTEM_CLOCK, Clock
from millstream.workers.fencing import check_mapper_state
from millstream.workers.mapper_worker.batch_size import BatchSize
from millstream.workers.mapper_worker.window_service import ServingState, WindowService

if TYPE_CHECKING:
    from millstream.processor import Processor

log = logging.getLogger("millstream.mapper")


class MapperInstance(WindowService):
    """One mapper instance over one input partition (a mapper worker reading several
    partitions runs one of these per partition, :mod:`millstream.workers.serve`).

    Args:
        processor: The processor this mapper belongs to.
        index: The input partition it reads (the index its records are kept under).
        store: The processor's store.
        clock: Time source.
        reader: The partition reader (default: the processor input's reader of ``index``).
        guid: This instance's GUID (default: a new random one).
        memory_limit_bytes: Its window's limit (default: ``Tuning.memory_limit_bytes``; a
            worker reading several partitions shares that between them).
    """

    def __init__(
        self,
        processor: Processor,
        index: int,
        store: Store,
        *,
        clock: Clock = SYSTEM_CLOCK,
        reader: PartitionReader | None = None,
        guid: str | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        super().__init__(index, guid or uuid.uuid4().hex, processor.num_reducers, clock)
        self.processor = processor
        self.store = store
        self.tuning = processor.tuning
        self.memory_limit_bytes = memory_limit_bytes or processor.tuning.memory_limit_bytes
        self.spec = processor.spec("mapper", index, self.guid)
        self.user = processor.mapper(self.spec, processor.config)
        self.reader = reader if reader is not None else processor.input.reader(index)
        self.persisted = MapperState()
        self._token = b""
        self.rows_read = 0
        self.rows_shuffled = 0
        self.batches = 0
        self._batches_unpersisted = 0
        self.dead_letters = 0
        """Rows of this instance's batches set aside as dead letters (replays count again)."""
        self.started_at = clock.now()
        self.errors = 0
        self.last_error = ""
        self._input_trimmed_to: int | None = None
        self.rows_spilled = 0
        self.bytes_spilled = 0
        self.spills = 0
        self.batch_size = BatchSize(processor.tuning.batch_rows, self.memory_limit_bytes)
        """The rows of the next read."""
        self._entry_bytes: collections.deque[int] = collections.deque(maxlen=8)
        """Window bytes of the last few mapped batches: the room the next one needs."""
        self.window_schema: pa.Schema | None = None
        """The schema the window carries: the mapped rows' unified schema (None until the
        first rows, unless recorded when it widened)."""
        self.caught_up = False
        """Whether the last read that returned rows returned every row the partition held
        (:attr:`~millstream.inputs.ReadResult.caught_up`): the next read waits for more."""
        self.rescale_through: int | None = None
        """During a rescale, the shuffle index this run's input ends past: at the first
        batch boundary after it (:mod:`millstream.ledger.rescale`)."""

    def _require_window(self, state: ServingState | None = None) -> _core.Window:
        window = (self.serving if state is None else state).window
        if window is None:
            raise RuntimeError("start_ingestion() must run first")
        return window

    def _check_persisted(self) -> None:
        """Step 3 of 4.3.3: the persisted state must be the one this instance last saw."""
        with self.store.read() as txn:
            self._verify_persisted(txn)

    def _verify_persisted(self, txn: StoreTransaction) -> None:
        """Raise :class:`SplitBrainError` if ``txn`` sees another persisted state (at least
        once: :class:`MapperSupersededError` if another instance took the numbering):
        :func:`~millstream.workers.fencing.check_mapper_state`."""
        check_mapper_state(
            txn, self.index, self.guid, self.persisted, at_least_once=self.processor.at_least_once
        )

    def _note_error(self, exc: BaseException) -> None:
        """Count an error the loop goes on after, and log it."""
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("mapper %d: %s", self.index, self.last_error)
