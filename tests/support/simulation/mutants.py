"""Deliberately broken workers (mutants) the simulation must catch.

Each mutant replaces one protocol step of the real workers with a known-wrong variant:
``(holder, attribute, replacement)``, for a test to monkeypatch. The mutants exist only
here; the workers are unchanged outside the tests that patch them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from millstream import _core
from millstream.exceptions import CommitUnknownResultError, StoreConflictError
from millstream.inputs.base import ReadResult
from millstream.inputs.queue_chunks import encode_chunks
from millstream.inputs.store_queue import StoreQueue
from millstream.ledger import (
    ReducerState,
    decode_reducer_state,
    read_mapper_state,
    read_numbering,
    read_reducer_state,
    reducer_state_key,
    write_numbering,
    write_reducer_state,
)
from millstream.ledger import rescale as rescale_module
from millstream.outputs import StagedOutputs
from millstream.rpc.calls import GetRowsCall
from millstream.state import StoreTransaction, pack
from millstream.workers import MapperWorker, ReducerWorker
from millstream.workers.mapper_worker.ingest import record_batch_plan
from millstream.workers.reducer_worker import commit as reducer_commit
from millstream.workers.reducer_worker import spill_reads as reducer_spill_reads
from millstream.workers.reducer_worker.pending_queue import PendingQueue


def _state_then_writes(
    self: ReducerWorker,
    state: ReducerState,
    reduce: Any,
    fetched: int,
    served_by: dict[int, str],
    **_: Any,
) -> bool:
    """Mutant (a): commit the reducer state first, then the user's writes separately."""
    txn = self.store.create_transaction()
    writes = self.store.create_transaction()
    outputs = self._staged_outputs()
    done = reduce(writes, outputs)
    if done is None:
        txn.reset()
        writes.reset()
        return False
    try:
        if read_reducer_state(txn, self.index, self.processor.num_partitions) != state:
            txn.reset()
            writes.reset()
            return False
        write_reducer_state(txn, self.index, done.state)
        txn.commit()
    except StoreConflictError:
        txn.reset()
        writes.reset()
        return False
    outputs.apply(writes)
    writes.commit()
    return True


_real_get_rows = MapperWorker.handle_get_rows


def _pop_on_read(
    self: MapperWorker,
    reducer_index: int,
    committed_row_index: int,
    max_rows: int,
    max_bytes: int,
    mapper_guid: str,
    **options: Any,
) -> tuple[int, int, bytes]:
    """Mutant (b): treat the rows just read as committed (pop the bucket on read)."""
    count, last, payload = _real_get_rows(
        self, reducer_index, committed_row_index, max_rows, max_bytes, mapper_guid, **options
    )
    if count:
        _real_get_rows(self, reducer_index, last, 1, max_bytes, mapper_guid)
    return count, last, payload


def _no_split_brain_check(self: MapperWorker, txn: Any) -> None:
    """Mutant (c): the mapper ingests without re-reading its persisted state."""


def _no_batch_plan(self: MapperWorker, begin: int, end: int) -> int:
    """Mutant (d): batches are cut by what the input has now, not where they were cut first.

    The bug fixed in afc2e68: a restarted or second instance re-cuts a batch differently,
    and a pre-aggregating map then numbers its rows differently.
    """
    return end


def _plan_without_state_check(self: MapperWorker, begin: int, end: int) -> int:
    """Mutant (e): batch boundaries recorded without checking the persisted state.

    The real bug the simulation found: another instance can persist past ``begin`` and
    clear the records there between this instance's split-brain check and its record, so
    it records a new cut below the other's trim point.
    """
    return record_batch_plan(self.store, self.index, begin, end, verify=lambda txn: None)


# -- ambiguous commits --------------------------------------------------------------

_real_append_piece = StoreQueue._append_piece
_appends = itertools.count()


def _append_piece_blindly(
    self: StoreQueue,
    txn: Any,
    partition: int,
    schema_ipc: bytes,
    chunks: list[tuple[int, bytes]],
    producer_id: str,
    sequence: int,
    piece: int,
) -> tuple[int, int]:
    """Append rows without checking whether this sequence was appended (records it still)."""
    begin, end = _real_append_piece(
        self, txn, partition, schema_ipc, chunks, f"blind-{next(_appends)}", sequence, piece
    )
    txn.set(self._key(partition, "producer", producer_id), pack((sequence, piece, begin, end)))
    return begin, end


def _append_not_idempotent(
    self: StoreQueue, partition: int, batch: Any, producer_id: str, sequence: int
) -> tuple[int, int]:
    """Mutant (f): the issue-13 bug, an append retried after an unknown result appends again."""
    schema_ipc = batch.schema.serialize().to_pybytes()
    chunks = encode_chunks(batch)
    return self._store.transact(  # type: ignore[no-any-return]
        lambda txn: _append_piece_blindly(
            self, txn, partition, schema_ipc, chunks, producer_id, sequence, 0
        ),
        idempotent=True,
    )


def _append_rechecked_after_unknown(
    self: StoreQueue, partition: int, batch: Any, producer_id: str, sequence: int
) -> tuple[int, int]:
    """Mutant (g): after an unknown result, look whether the append landed, else append again.

    Right when the commit either landed or never will; wrong when it is still in flight
    and lands after the look.
    """
    schema_ipc = batch.schema.serialize().to_pybytes()
    chunks = encode_chunks(batch)

    def body(txn: Any) -> tuple[int, int]:
        return _append_piece_blindly(
            self, txn, partition, schema_ipc, chunks, producer_id, sequence, 0
        )

    try:
        return self._store.transact(body)  # type: ignore[no-any-return]
    except CommitUnknownResultError:
        if self.producer_sequence(partition, producer_id) >= sequence:
            return (-1, -1)
        return self._store.transact(body)  # type: ignore[no-any-return]


def _unknown_means_applied(self: MapperWorker, written: Any) -> bool:
    """Mutant (h): the mapper takes a commit with an unknown result as applied."""
    return written is not None


_real_reduce_and_commit = ReducerWorker._reduce_and_commit


def _reducer_trusts_unknown(
    self: ReducerWorker, state: Any, reduce: Any, *args: Any, **kwargs: Any
) -> bool:
    """Mutant (i): the reducer takes a commit with an unknown result as applied."""
    rounds: list[Any] = []

    def noted(*call: Any) -> Any:
        rounds.append(reduce(*call))
        return rounds[-1]

    try:
        return _real_reduce_and_commit(self, state, noted, *args, **kwargs)  # type: ignore[no-any-return]
    except CommitUnknownResultError:
        self.last_state = rounds[-1].state
        return True


# -- races, reused addresses, trimmed reads, liveness ----------------------------------


def _snapshot_state_read(
    txn: StoreTransaction,
    reducer_index: int,
    num_mappers: int,
    served_by: Mapping[int, str],
) -> tuple[ReducerState, dict[int, str]]:
    """Mutant (j): the reducer re-reads its state conflict-free (a snapshot read).

    The re-read inside the commit transaction then sees the state but does not guard it:
    a duplicate instance that commits between the re-read and the commit goes unnoticed.
    """
    raw = txn.get(reducer_state_key(reducer_index), snapshot=True)
    state = decode_reducer_state(raw, reducer_index, num_mappers)
    return state, {m: guid for m, guid in served_by.items() if read_numbering(txn, m) != guid}


def _append_outside_the_commit(self: StagedOutputs, txn: StoreTransaction) -> None:
    """Mutant: the reducer appends its output rows in transactions of their own (as a
    producer would) instead of in its commit: a commit that then fails, or lands unknown
    and is redone, leaves rows in the queue twice or for effects never committed."""
    for queue, partition, rows in self._appends:
        queue.append(partition, rows)


def _get_rows_ignoring_guid(
    self: MapperWorker,
    reducer_index: int,
    committed_row_index: int,
    max_rows: int,
    max_bytes: int,
    mapper_guid: str,
    **options: Any,
) -> tuple[int, int, bytes]:
    """Mutant (k): GetRows serves whoever calls, whatever mapper instance they meant."""
    return _real_get_rows(
        self, reducer_index, committed_row_index, max_rows, max_bytes, self.guid, **options
    )


def _read_cut_without_check(self: MapperWorker, begin: int, end: int) -> ReadResult:
    """Mutant (l): a failed re-read of a recorded batch is an input error, whatever the
    persisted state says (the bug of issue 13 item 3: a duplicate reading behind the other
    instance's trim stopped the run)."""
    result = self._read_exactly(begin, end)
    self._check_persisted()
    return result


_real_start_ingestion = MapperWorker.start_ingestion


def _restart_from_stale_state(self: MapperWorker) -> None:
    """Mutant (m): after split brain an instance restarts from the state it last saw, not
    the persisted one, so it meets split brain again and again and never progresses."""
    if self.window is None:
        _real_start_ingestion(self)
        return
    stale, old = self.persisted, self.window
    self.window = _core.Window(
        self.processor.num_reducers,
        self.tuning.memory_limit_bytes,
        stale.input_unread_row_index,
        stale.shuffle_unread_row_index,
        stale.continuation_token,
    )
    old.close()
    self._token = stale.continuation_token
    self.end_of_input = False


def _ignore_spill(
    self: ReducerWorker, committed: Any, max_bytes: int, **_: Any
) -> tuple[bool, dict[int, Any]]:
    """Mutant (n): the straggler never reads the rows mappers spilled for it."""
    return False, {}


def _keep_spill(txn: Any, reducer_index: int, mapper_index: int, through: int) -> None:
    """Mutant (o): the reducer leaves the spilled rows it committed in the store."""


def _commit_every_fetched_row(self: PendingQueue, prefix: dict[int, int]) -> tuple[int, ...]:
    """Mutant (p): a queue reducer commits every row it fetched, finished or not."""
    return tuple(self.fetched)


def _any_answer_continues(self: GetRowsCall, earlier: GetRowsCall) -> bool:
    """Mutant (q): a pipelined reducer takes the answer fetched during its commit whatever
    position it continues from (the commit may have failed)."""
    return earlier.key == self.key


MUTANTS: dict[str, tuple[object, str, Callable[..., Any]]] = {
    "pipelined_fetch_ignores_its_start": (GetRowsCall, "continues", _any_answer_continues),
    "queue_reducer_commits_unfinished_rows": (
        PendingQueue,
        "committed_after",
        _commit_every_fetched_row,
    ),
    "reducer_state_committed_before_user_writes": (
        ReducerWorker,
        "_reduce_and_commit",
        _state_then_writes,
    ),
    "mapper_pops_bucket_on_read": (MapperWorker, "handle_get_rows", _pop_on_read),
    "mapper_skips_split_brain_check": (MapperWorker, "_verify_persisted", _no_split_brain_check),
    "mapper_ignores_batch_plan": (MapperWorker, "plan_batch", _no_batch_plan),
    "mapper_plans_batch_without_state_check": (
        MapperWorker,
        "plan_batch",
        _plan_without_state_check,
    ),
    "queue_append_not_idempotent": (StoreQueue, "append_as", _append_not_idempotent),
    "queue_append_rechecked_after_unknown": (
        StoreQueue,
        "append_as",
        _append_rechecked_after_unknown,
    ),
    "mapper_takes_unknown_commit_as_applied": (MapperWorker, "_applied", _unknown_means_applied),
    "reducer_takes_unknown_commit_as_applied": (
        ReducerWorker,
        "_reduce_and_commit",
        _reducer_trusts_unknown,
    ),
    "reducer_rereads_state_as_snapshot": (
        reducer_commit,
        "read_commit_fences",
        _snapshot_state_read,
    ),
    "mapper_serves_any_guid": (MapperWorker, "handle_get_rows", _get_rows_ignoring_guid),
    "reducer_appends_outside_its_commit": (StagedOutputs, "apply", _append_outside_the_commit),
    "mapper_fails_on_rows_trimmed_by_duplicate": (
        MapperWorker,
        "_read_cut",
        _read_cut_without_check,
    ),
    "reducer_ignores_spilled_rows": (ReducerWorker, "_read_spilled", _ignore_spill),
    "reducer_keeps_consumed_spill": (reducer_spill_reads, "clear_spill", _keep_spill),
    "mapper_restarts_from_stale_state": (
        MapperWorker,
        "start_ingestion",
        _restart_from_stale_state,
    ),
}


def _only_persisted_rows_committed(txn: StoreTransaction, info: Any, partition: int) -> int:
    """Rescale mutant: hand over at each partition's persisted state, as if no reducer had
    committed a row after it: rows some old reducers committed go to new owners, which
    apply them again."""
    return read_mapper_state(txn, partition).shuffle_unread_row_index - 1


RESCALE_MUTANTS: dict[str, tuple[object, str, Callable[..., Any]]] = {
    "rescale_ignores_rows_committed_past_the_persisted_state": (
        rescale_module,
        "committed_through",
        _only_persisted_rows_committed,
    ),
}


def _keep_numbering(self: MapperWorker, txn: StoreTransaction) -> Any:
    """At-least-once mutant (n): a new instance takes the numbering but numbers its rows
    from the persisted state, below what reducers committed from the instance before."""
    state = read_mapper_state(txn, self.index)
    write_numbering(txn, self.index, self.guid)
    return state


def commit_without_numbering_check(
    self: ReducerWorker, state: Any, reduce: Any, fetched: int, _: Any, **kwargs: Any
) -> bool:
    """At-least-once mutant (o): the reducer commits rows whatever instance served them
    (caught by a targeted replay in ``test_at_least_once_races.py``)."""
    return _real_reduce_and_commit(self, state, reduce, fetched, {}, **kwargs)  # type: ignore[no-any-return]


AT_LEAST_ONCE_MUTANTS: dict[str, tuple[object, str, Callable[..., Any]]] = {
    "mapper_numbers_from_persisted_state": (MapperWorker, "_take_numbering", _keep_numbering),
}
