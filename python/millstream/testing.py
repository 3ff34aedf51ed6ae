"""Helpers for testing jobs and the protocol without processes, sockets or waiting.

- :class:`MemoryInput`: a bounded input of in-memory partitions (one table per mapper).
- :class:`ManualClock`: time that moves only when told to; ``sleep`` returns at once.
- :class:`InProcessTransport`: GetRows between workers of one process, routed by address
  to the mapper bound there (the reducers' ``RowsClient``, no gRPC).
- :func:`run_in_process`: a processor over bounded input, run to the end in this process
  with the real mapper and reducer workers stepped in turn on these three.

A job's test runs its own :class:`~millstream.Mapper` and :class:`~millstream.Reducer`
through the real protocol, and reads what ``reduce`` committed from the store::

    processor = ms.Processor(mapper=..., reducer=..., input=MemoryInput([table]), ...)
    run_in_process(processor)

millstream's own simulation (``tests/simulation``) drives the same workers one step at a
time on :class:`ManualClock` and :class:`InProcessTransport`, adding faults.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from millstream.inputs.base import ReadResult
from millstream.rpc.calls import GetRowsCall, GetRowsResult, RowsHandler
from millstream.rpc.serving import serve_get_rows
from millstream.workers.clock import ManualClock

if TYPE_CHECKING:
    from millstream.processor import Processor
    from millstream.state import StoreTransaction
    from millstream.workers.mapper_worker import MapperWorker

__all__ = ["InProcessTransport", "ManualClock", "MemoryInput", "MemoryReader", "run_in_process"]


class MemoryReader:
    """A reader of one :class:`MemoryInput` partition; the token is the next row's index.

    Attributes:
        trimmed: The highest row index passed to :meth:`trim` (rows below it are consumed
            and persisted; a test can check how far its input was trimmed).
    """

    def __init__(self, batch: pa.RecordBatch) -> None:
        self._batch = batch
        self.trimmed = 0

    def read(
        self, begin_row_index: int, end_row_index_hint: int, continuation_token: bytes
    ) -> ReadResult:
        """Rows ``[begin_row_index, end_row_index_hint)`` (at least one if any are left)."""
        total = self._batch.num_rows
        end = min(total, max(begin_row_index + 1, end_row_index_hint))
        rows = self._batch.slice(begin_row_index, max(0, end - begin_row_index))
        return ReadResult(rows, str(end).encode(), end >= total)

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        """Record how far the input is consumed (the rows stay readable)."""
        self.trimmed = max(self.trimmed, row_index)

    def close(self) -> None:
        """Nothing to release."""


class MemoryInput:
    """A bounded input of in-memory partitions, one per mapper.

    Args:
        partitions: Each partition's rows, as a table, a record batch or a list of record
            batches (all of one schema).
    """

    def __init__(
        self, partitions: Sequence[pa.Table | pa.RecordBatch | Sequence[pa.RecordBatch]]
    ) -> None:
        if not partitions:
            raise ValueError("MemoryInput needs at least one partition")
        self._batches = [_one_batch(p) for p in partitions]

    @property
    def num_partitions(self) -> int:
        """Partitions (and so mappers)."""
        return len(self._batches)

    def reader(self, partition: int) -> MemoryReader:
        """A reader of partition ``partition``."""
        return MemoryReader(self._batches[partition])


def _one_batch(rows: pa.Table | pa.RecordBatch | Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    if isinstance(rows, pa.RecordBatch):
        return rows
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches(list(rows))
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


class InProcessTransport:
    """GetRows within one process: a call goes to the handler bound at its address.

    The reducer side of GetRows (``RowsClient``) for workers that run in one process; a
    mapper worker is the handler. A call to an address nothing is bound at fails with
    :class:`ConnectionError`, as an unreachable mapper does.

    Args:
        handlers: Address -> handler, shared with the caller (changes to it are seen);
            a new empty mapping by default.
        max_response_bytes: The byte cap of one answer, as a gRPC server's
            (``Tuning.get_rows_max_bytes``); None: only the caller's.
    """

    first_answer_at: float | None = None
    """Not known here: a simulation's rounds count their cadence from their start."""

    def __init__(
        self,
        handlers: MutableMapping[str, RowsHandler] | None = None,
        *,
        max_response_bytes: int | None = None,
    ) -> None:
        self._handlers: MutableMapping[str, RowsHandler] = {} if handlers is None else handlers
        self._max_response_bytes = max_response_bytes
        self._prefetched: dict[tuple[int, str, str, int], tuple[GetRowsCall, object]] = {}

    def bind(self, address: str, handler: RowsHandler) -> None:
        """Serve the calls to ``address`` with ``handler`` (replacing any before it)."""
        self._handlers[address] = handler

    def unbind(self, address: str) -> None:
        """Nothing serves ``address`` any more."""
        self._handlers.pop(address, None)

    def handler(self, address: str) -> RowsHandler | None:
        """What serves ``address``, if anything."""
        return self._handlers.get(address)

    def serve(self, call: GetRowsCall) -> GetRowsResult:
        """One call, answered by the handler at its address.

        Raises:
            ConnectionError: Nothing is bound at the call's address.
        """
        handler = self.handler(call.address)
        if handler is None:
            raise ConnectionError(f"nothing listens on {call.address} (in process)")
        # The gRPC server's path (serve_get_rows), except that in process a call is never
        # held: a simulation steps the workers itself.
        return serve_get_rows(
            handler,
            reducer_index=call.reducer_index,
            committed_row_index=call.committed_row_index,
            max_rows=call.max_rows,
            max_bytes=call.max_bytes,
            mapper_guid=call.mapper_guid,
            after_row_index=call.after_row_index,
            shuffle_indices=call.shuffle_indices,
            gather_rows=call.gather_rows,
            max_response_bytes=self._max_response_bytes,
        )

    def get_rows_many(self, calls: Sequence[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        """The calls one after another (a prefetched answer serves a call that continues
        from the same start); each slot holds the result or the error."""
        prefetched, self._prefetched = self._prefetched, {}
        results: list[GetRowsResult | BaseException] = []
        for call in calls:
            earlier = prefetched.get(call.key)
            if earlier is not None and call.continues(earlier[0]):
                results.append(earlier[1])  # type: ignore[arg-type]
                continue
            try:
                results.append(self.serve(call))
            except Exception as exc:
                results.append(exc)
        return results

    def take_prefetched(self, call: GetRowsCall) -> GetRowsResult | BaseException | None:
        """The prefetched answer that serves ``call`` (removed), if there is one."""
        earlier = self._prefetched.pop(call.key, None)
        if earlier is None or not call.continues(earlier[0]):
            return None
        return earlier[1]  # type: ignore[return-value]

    def prefetch(self, calls: Sequence[GetRowsCall]) -> None:
        """Serve the calls now (a mapper that answers before the reducer's commit ends);
        the next :meth:`get_rows_many` takes the answers of the calls it repeats. A call
        for a round that starts later (``start_in_seconds``) only reports its committed
        index now; the round serves it."""
        for call in calls:
            if call.start_in_seconds > 0:  # what the mapper does on the call's arrival
                self._acknowledge(dataclasses.replace(call, max_rows=0, wait_seconds=0))
                continue
            try:
                result: object = self.serve(call)
            except Exception as exc:
                result = exc
            self._prefetched[call.key] = (call, result)

    def acknowledge_many(self, calls: Sequence[GetRowsCall]) -> None:
        """The acknowledgements one after another; their errors are ignored."""
        for call in calls:
            self._acknowledge(call)

    def _acknowledge(self, call: GetRowsCall) -> None:
        with contextlib.suppress(Exception):  # an acknowledgement that fails is harmless
            self.serve(call)

    def close(self) -> None:
        """Nothing to release."""


def run_in_process(processor: Processor, *, max_rounds: int = 100_000) -> None:
    """Run a processor over bounded input to the end in this process.

    The real mapper and reducer workers run in turn (every mapper reads and maps a batch,
    every reducer fetches, reduces and commits, every mapper persists its state), on a
    :class:`ManualClock` and an :class:`InProcessTransport`, until every mapper has
    drained: every row's effect committed once, as a run with processes would commit it.
    Errors of ``map`` and ``reduce`` propagate at once. For tests of a job's logic, not
    for speed.

    Raises:
        UserCodeError: ``map`` or ``reduce`` raised.
        RuntimeError: The input did not drain within ``max_rounds`` rounds (an unbounded
            input never does).
    """
    from millstream.workers.mapper_worker import MapperWorker
    from millstream.workers.reducer_worker import ReducerWorker

    clock = ManualClock()
    transport = InProcessTransport()
    store = processor.open_store()
    mappers = [
        MapperWorker(processor, m, store, clock=clock, guid=f"mapper-{m}")
        for m in range(processor.num_partitions)
    ]
    try:
        for mapper in mappers:
            address = f"in-process:mapper-{mapper.index}"
            transport.bind(address, mapper)
            mapper.start_ingestion()
            store.transact(_registration(mapper, address, clock.wall()))
        reducers = [
            ReducerWorker(processor, r, store, transport, clock=clock, guid=f"reducer-{r}")
            for r in range(processor.num_reducers)
        ]
        for _ in range(max_rounds):
            for mapper in mappers:
                if not mapper.end_of_input:
                    mapper.ingest_once()
            for reducer in reducers:
                reducer.run_once()
            for mapper in mappers:
                mapper.trim_input_rows()
            if all(mapper.is_drained() for mapper in mappers):
                for mapper in mappers:
                    mapper.mark_drained()
                for reducer in reducers:
                    while not reducer.finish():
                        pass
                return
        raise RuntimeError(
            f"the input did not drain in {max_rounds} rounds; run_in_process needs a bounded "
            "input (MemoryInput, ParquetLog)"
        )
    finally:
        for mapper in mappers:
            mapper.close()
        store.close()


def _registration(
    worker: MapperWorker, address: str, now: float
) -> Callable[[StoreTransaction], None]:
    """What registers ``worker`` in discovery at ``address`` (reducers find it there)."""
    from millstream.ledger import register_worker

    def register(txn: StoreTransaction) -> None:
        register_worker(txn, "mapper", worker.index, worker.guid, address, now)

    return register
