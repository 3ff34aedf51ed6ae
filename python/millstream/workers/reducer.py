"""The reducer worker (thesis 4.4.2): fetch from every mapper, reduce, commit atomically.

:meth:`ReducerWorker.run_once` is one iteration of the main procedure, a plain method a
simulation can drive; :meth:`~ReducerWorker.run` is the thin loop around it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from millstream import _core
from millstream.api import Transaction, WorkerSpec
from millstream.exceptions import RetryableStoreError, UserCodeError
from millstream.rpc.client import GetRowsCall, GetRowsResult, RowsClient
from millstream.state import Store
from millstream.state.records import (
    SYSTEM,
    ReducerState,
    WorkerInfo,
    freshest_workers,
    list_workers,
    read_reducer_state,
    write_reducer_state,
)
from millstream.workers.clock import SYSTEM_CLOCK, Clock
from millstream.workers.mapper import drained_key

if TYPE_CHECKING:
    from millstream.processor import Processor


def reduced_key(reducer_index: int, what: str) -> tuple[str, str, int, str]:
    """Counter key of a reducer's committed totals (``rows``, ``commits``)."""
    return (*SYSTEM, "reduced", reducer_index, what)


class ReducerWorker:
    """One reducer instance.

    Args:
        processor: The processor this reducer belongs to.
        index: The reducer's index.
        store: The processor's store.
        rows_client: How GetRows reaches the mappers.
        clock: Time source.
        guid: This instance's GUID (default: a new random one).
    """

    def __init__(
        self,
        processor: Processor,
        index: int,
        store: Store,
        rows_client: RowsClient,
        *,
        clock: Clock = SYSTEM_CLOCK,
        guid: str | None = None,
    ) -> None:
        self.processor = processor
        self.index = index
        self.store = store
        self.rows_client = rows_client
        self.clock = clock
        self.tuning = processor.tuning
        self.guid = guid or uuid.uuid4().hex
        self.spec = WorkerSpec(
            processor.name,
            "reducer",
            index,
            self.guid,
            processor.num_mappers,
            processor.num_reducers,
        )
        self.user = processor.reducer(self.spec, processor.config)
        self.commits = 0
        self.rows_reduced = 0
        self.bytes_fetched = 0
        self.split_brains = 0
        self.last_state: ReducerState | None = None
        self.all_drained = False

    def _read_view(self) -> tuple[ReducerState, dict[int, WorkerInfo], set[int]]:
        """Steps 2-3: the persisted state, live mappers, and mappers already drained."""
        m = self.processor.num_mappers
        txn = self.store.create_transaction()
        try:
            state = read_reducer_state(txn, self.index, m)
            mappers = freshest_workers(list_workers(txn, "mapper"))
            drained = {i for i in range(m) if txn.get(drained_key(i), snapshot=True) is not None}
        finally:
            txn.reset()
        return state, mappers, drained

    def run_once(self) -> bool:
        """One iteration of thesis 4.4.2. Returns whether a batch was committed.

        Raises:
            UserCodeError: ``reduce`` raised; nothing of the batch was committed.
        """
        state, mappers, drained = self._read_view()
        self.last_state = state
        self.all_drained = len(drained) == self.processor.num_mappers
        calls = [
            GetRowsCall(
                m,
                info.address,
                info.guid,
                self.index,
                state.committed_row_indices[m],
                self.tuning.get_rows_max_rows,
                self.tuning.get_rows_max_bytes,
            )
            for m, info in sorted(mappers.items())
            if m not in drained and m < self.processor.num_mappers
        ]
        if not calls:
            return False
        results = self.rows_client.get_rows_many(calls)
        new = list(state.committed_row_indices)
        payloads: list[bytes] = []
        ranges: list[str] = []
        for call, result in zip(calls, results, strict=True):
            if not isinstance(result, GetRowsResult) or result.row_count == 0:
                continue
            if result.last_shuffle_row_index <= call.committed_row_index:
                continue
            new[call.mapper_index] = result.last_shuffle_row_index
            payloads.append(result.arrow_ipc)
            ranges.append(
                f"mapper {call.mapper_index} shuffle rows "
                f"({call.committed_row_index}, {result.last_shuffle_row_index}]"
            )
        if not payloads:
            return False
        batch = _core.decode_ipc(payloads)
        return self._reduce_and_commit(state, ReducerState(tuple(new)), batch, ranges, payloads)

    def _reduce_and_commit(
        self,
        state: ReducerState,
        new: ReducerState,
        batch: pa.RecordBatch,
        ranges: list[str],
        payloads: list[bytes],
    ) -> bool:
        """Steps 5-8: reduce inside a transaction, re-check the state, write it, commit."""
        txn = self.store.create_transaction()
        try:
            try:
                self.user.reduce(batch, Transaction(txn))
            except Exception as exc:
                raise UserCodeError(
                    f"reduce of reducer {self.index} raised on {batch.num_rows} rows "
                    f"({'; '.join(ranges)}): {exc!r}. Nothing of this batch was committed; "
                    "fix the reducer and restart the processor"
                ) from exc
            if read_reducer_state(txn, self.index, self.processor.num_mappers) != state:
                self.split_brains += 1
                txn.reset()
                return False
            write_reducer_state(txn, self.index, new)
            txn.add(reduced_key(self.index, "rows"), batch.num_rows)
            txn.add(reduced_key(self.index, "commits"), 1)
            txn.commit()
        except RetryableStoreError:
            txn.reset()
            return False
        except BaseException:
            txn.reset()
            raise
        self.commits += 1
        self.rows_reduced += batch.num_rows
        self.bytes_fetched += sum(map(len, payloads))
        return True

    def metrics(self) -> dict[str, float | int | str]:
        """Status figures for ``millstream status``."""
        committed = self.last_state.committed_row_indices if self.last_state else ()
        return {
            "guid": self.guid,
            "commits": self.commits,
            "rows_reduced": self.rows_reduced,
            "bytes_fetched": self.bytes_fetched,
            "split_brains": self.split_brains,
            "committed_row_indices": ",".join(map(str, committed)),
        }

    def run(self, stop: threading.Event, *, on_tick: Callable[[], None] | None = None) -> None:
        """Reduce until every mapper is drained or ``stop`` is set."""
        t = self.tuning
        last_commit = self.clock.now()
        while not stop.is_set():
            wait = t.commit_interval_seconds - (self.clock.now() - last_commit)
            if wait > 0:
                self.clock.sleep(wait, stop)
            committed = self.run_once()
            if committed:
                last_commit = self.clock.now()
            if on_tick is not None:
                on_tick()
            if self.all_drained:
                return
            if not committed:
                self.clock.sleep(t.idle_seconds, stop)
