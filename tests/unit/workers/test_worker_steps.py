"""The worker protocol driven step by step in one process (no threads, no gRPC).

Mappers and reducers are the real classes; GetRows goes through the in-process client, time
through a manual clock, and the input is in memory. Each test steps the protocol by hand
to reach a situation (restart, split brain, failure) and checks exactly-once on the output.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import (
    ConfigurationError,
    SplitBrainError,
    StaleMapperError,
    UserCodeError,
)
from millstream.ledger import (
    OUTPUT,
    REDUCER_ACTIVITIES,
    ReducerState,
    check_processor_info,
    list_workers,
    read_mapper_state,
    read_reducer_state,
    register_worker,
)
from millstream.ledger.rescale import begin_rescale, finish_rescale
from millstream.outputs import StagedOutputs
from millstream.state import StoreTransaction, decode_int64, encode_int64
from millstream.state.limits import StoreLimits
from millstream.testing import InProcessTransport
from millstream.workers import Heartbeat, MapperWorker, ReducerWorker
from millstream.workers.reducer_worker import Round
from millstream.workers.status_report import TimeSpent

from tests.support.worker_fixtures import (
    BATCH_ROWS,
    ROWS_PER_PARTITION,
    AddCounts,
    Cluster,
    CountRows,
    MemoryReader,
    PreAggregating,
    WideningMapper,
)
from tests.support.worker_fixtures import expected_counts as _expected
from tests.support.worker_fixtures import tables as _tables


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, _tables())
    yield c
    c.store.close()


def test_steps_reach_exact_results_and_trim_the_input(cluster: Cluster) -> None:
    cluster.run_to_end()
    assert cluster.output() == _expected(cluster.tables)
    txn = cluster.store.create_transaction()
    try:
        for m, mapper in cluster.mappers.items():
            state = read_mapper_state(txn, m)
            assert state.input_unread_row_index == ROWS_PER_PARTITION
            assert state.shuffle_unread_row_index == ROWS_PER_PARTITION
            reader = mapper.reader
            assert isinstance(reader, MemoryReader)
            assert reader.trims == sorted(reader.trims)
            assert reader.trims[-1] == ROWS_PER_PARTITION
        for r in cluster.reducers:
            committed = read_reducer_state(txn, r, 2).committed_row_indices
            assert all(0 <= c < ROWS_PER_PARTITION for c in committed)
    finally:
        txn.reset()


def test_input_is_trimmed_only_up_to_persisted_state(cluster: Cluster) -> None:
    for _ in range(5):
        for mapper in cluster.mappers.values():
            mapper.ingest_once()
    # A commit reaches a mapper with the reducer's next GetRows (its committed index).
    assert cluster.reducers[0].run_once()
    assert not cluster.reducers[0].run_once()
    for mapper in cluster.mappers.values():
        assert not mapper.trim_input_rows()
        reader = mapper.reader
        assert isinstance(reader, MemoryReader)
        assert reader.trims == []
    assert cluster.reducers[1].run_once()
    assert not cluster.reducers[1].run_once()
    for mapper in cluster.mappers.values():
        assert mapper.trim_input_rows()
        assert mapper.persisted.input_unread_row_index == 5 * BATCH_ROWS


def test_stale_mapper_guid_is_rejected(cluster: Cluster) -> None:
    mapper = cluster.mappers[0]
    mapper.ingest_once()
    with pytest.raises(StaleMapperError, match="refresh discovery"):
        mapper.handle_get_rows(0, -1, 10, 1 << 20, "not-" + mapper.guid)
    # Discovery names another instance at this mapper's address: the call is refused and
    # nothing of mapper 0 is committed.
    address = f"mapper-0-{mapper.guid}"
    cluster.clock.advance(1.0)
    cluster.store.transact(
        lambda txn: register_worker(txn, "mapper", 0, "gone", address, cluster.clock.wall())
    )
    reducer = cluster.reducers[0]
    assert not reducer.run_once()
    assert "StaleMapperError" in reducer.last_error
    assert reducer.last_state is not None
    assert reducer.last_state.committed_row_indices[0] == -1


def test_mapper_restart_replays_without_duplicates(cluster: Cluster) -> None:
    for _ in range(3):
        cluster.step()
    for _ in range(2):
        cluster.mappers[0].ingest_once()
    cluster.reducers[0].run_once()  # reducer 0 commits rows the mapper has not persisted
    cluster.handlers.clear()
    cluster.start_mapper(0)  # a fresh instance (crash): re-reads from the persisted state
    cluster.start_mapper(1)
    cluster.run_to_end()
    assert cluster.output() == _expected(cluster.tables)


def test_mapper_split_brain_restarts_ingestion(cluster: Cluster) -> None:
    first = cluster.mappers[0]
    second = cluster.start_mapper(0)  # a second live instance of mapper 0, now in discovery
    for _ in range(3):
        second.ingest_once()
        first.ingest_once()
    for _ in range(2):  # commit, then pass the committed index to the mapper
        for reducer in cluster.reducers.values():
            reducer.run_once()
    assert second.trim_input_rows()
    with pytest.raises(SplitBrainError):
        first.ingest_once()
    with pytest.raises(SplitBrainError):
        first.trim_input_rows()
    first.start_ingestion()  # what the run loop does after the delay
    assert first.persisted == second.persisted
    cluster.run_to_end()
    assert cluster.output() == _expected(cluster.tables)


def _commit_one_row(worker: ReducerWorker, state: ReducerState) -> bool:
    """Reduce one row of key 1 and commit it with ``state`` unchanged (a stale view)."""
    batch = pa.record_batch({"key": pa.array([1], pa.int64())})

    def reduce(txn: StoreTransaction, outputs: StagedOutputs) -> Round:
        worker.user.reduce(batch, ms.Transaction(txn, outputs))
        return Round(state, batch.num_rows, {})

    return worker._reduce_and_commit(state, reduce, 0, {})


def test_reducer_split_brain_commits_once(cluster: Cluster) -> None:
    for mapper in cluster.mappers.values():
        mapper.ingest_once()
    twin = ReducerWorker(
        cluster.processor,
        0,
        cluster.store,
        InProcessTransport(cluster.handlers),
        clock=cluster.clock,
    )
    # Both read the same state and fetch the same rows; the second commit must fail.
    state, _, _ = twin._read_view()
    assert cluster.reducers[0].run_once()
    assert not _commit_one_row(twin, state)
    assert twin.split_brains == 1
    cluster.reducers[twin.index] = twin
    cluster.run_to_end()
    assert cluster.output() == _expected(cluster.tables)


def test_map_error_names_the_rows_and_pushes_nothing(tmp_path: Path) -> None:
    tables = _tables(poison=250)
    c = Cluster(tmp_path, tables, config={"fail_map": True})
    mapper = c.mappers[0]
    mapper.ingest_once()
    mapper.ingest_once()
    with pytest.raises(UserCodeError, match=r"input rows \[200, 300\)"):
        mapper.ingest_once()
    window = mapper.window
    assert window is not None
    assert window.snapshot().input_end_row_index == 200
    c.store.close()


def test_reduce_error_commits_nothing_and_a_fixed_reducer_is_exact(tmp_path: Path) -> None:
    tables = _tables(poison=250)
    c = Cluster(tmp_path, tables, config={"fail_reduce": True})
    poisoned = pa.record_batch({"key": pa.array([-1], pa.int64())})
    reducer = c.reducers[ms.Partitioned.by_hash(poisoned, "key", 2).reducer_indices[0].as_py()]
    for _ in range(3):
        for mapper in c.mappers.values():
            mapper.ingest_once()
    with pytest.raises(UserCodeError, match=r"mapper 0 shuffle rows \(-1, \d+\]"):
        reducer.run_once()
    txn = c.store.create_transaction()
    try:
        assert read_reducer_state(txn, reducer.index, 2).committed_row_indices == (-1, -1)
    finally:
        txn.reset()
    for r in c.reducers.values():
        r.user.config = {}  # the fix: the same store, a reducer that no longer raises
    c.run_to_end()
    assert c.output() == _expected(tables)
    c.store.close()


def test_too_large_transactions_are_split(tmp_path: Path) -> None:
    limits = StoreLimits(max_transaction_bytes=200_000)
    c = Cluster(tmp_path, _tables(), config={"big_values": True}, limits=limits)
    for _ in range(4):
        for mapper in c.mappers.values():
            mapper.ingest_once()
    reducer = c.reducers[0]
    assert not reducer.run_once()  # about 400 rows x 2 kB: over the limit, fetch halves
    assert "TransactionTooLargeError" in reducer.last_error
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    assert reducer.commits > 1
    c.store.close()


def test_metrics_describe_the_window(cluster: Cluster) -> None:
    mapper = cluster.mappers[0]
    mapper.ingest_once()
    metrics = mapper.metrics()
    assert metrics["window_rows"] == BATCH_ROWS
    assert int(metrics["window_bytes"]) > 0
    assert metrics["input_end_row_index"] == BATCH_ROWS
    assert metrics["persisted_input_unread_row_index"] == 0


def test_compatible_mapper_schemas_are_unified(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), mapper=WideningMapper, config={"other": pa.float64()})
    for mapper in c.mappers.values():
        mapper.ingest_once()
    assert c.reducers[0].run_once()
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    c.store.close()


def test_incompatible_mapper_schemas_name_the_mappers(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), mapper=WideningMapper, config={"other": pa.string()})
    for mapper in c.mappers.values():
        mapper.ingest_once()
    with pytest.raises(UserCodeError, match="incompatible schemas") as caught:
        c.reducers[0].run_once()
    assert "mapper 0: key: int64, w: int64" in str(caught.value)
    assert "mapper 1: key: int64, w: string" in str(caught.value)
    c.store.close()


def test_a_batch_over_the_memory_limit_is_a_configuration_error(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), memory_limit_bytes=100)
    with pytest.raises(ConfigurationError, match=r"Lower tuning.batch_rows"):
        c.mappers[0].ingest_once()
    c.store.close()


def test_a_row_no_get_rows_response_can_carry_stops_the_mapper(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), grpc_max_message_bytes=250, get_rows_max_bytes=200)
    mapper = c.mappers[0]
    with pytest.raises(UserCodeError, match=r"takes \d+ bytes in a GetRows response") as caught:
        mapper.ingest_once()
    assert "more than the largest response of 186 bytes" in str(caught.value)
    assert "tuning.grpc_max_message_bytes" in str(caught.value)
    assert mapper.window is not None
    assert mapper.window.snapshot().input_end_row_index == 0
    c.store.close()


def test_user_classes_get_their_spec_and_config(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), config={"answer": 42})
    mapper, reducer = c.mappers[1], c.reducers[0]
    assert mapper.user.spec.role == "mapper"
    assert mapper.user.spec.index == 1
    assert mapper.user.spec.guid == mapper.guid
    assert (mapper.user.spec.num_mappers, mapper.user.spec.num_reducers) == (2, 2)
    assert reducer.user.spec.role == "reducer"
    assert reducer.user.config == {"answer": 42}
    # The processor GUID is the same for every worker and every restart of this processor.
    again = MapperWorker(c.processor, 1, c.store, clock=c.clock)
    assert again.guid != mapper.guid
    assert again.user.spec.processor_guid == mapper.user.spec.processor_guid
    assert reducer.user.spec.processor_guid == c.processor.guid != ""
    c.store.close()


@pytest.mark.parametrize("acknowledge", [True, False])
def test_commits_reach_the_mappers_at_once_when_acknowledged(
    tmp_path: Path, acknowledge: bool
) -> None:
    c = Cluster(tmp_path, _tables(), acknowledge_commits=acknowledge)
    for mapper in c.mappers.values():
        mapper.ingest_once()
    for reducer in c.reducers.values():
        assert reducer.run_once()
    for mapper in c.mappers.values():
        window = mapper.window
        assert window is not None
        assert window.snapshot().buffered_rows == (0 if acknowledge else BATCH_ROWS)
        assert mapper.trim_input_rows() == acknowledge
    c.store.close()


@pytest.mark.parametrize("replay", ["restart", "second_instance"])
def test_replayed_batches_keep_their_boundaries(tmp_path: Path, replay: str) -> None:
    """A pre-aggregating map over a growing input: re-reading after more rows arrived must
    cut the same batches as the first time, or shuffle indices would name other rows."""
    visible = [150]  # the queue holds 150 rows of each partition so far
    c = Cluster(tmp_path, _tables(), mapper=PreAggregating, reducer=AddCounts, visible=visible)
    first = c.mappers[0]
    first.ingest_once()  # [0, 100)
    first.ingest_once()  # [100, 150): a short batch, all there was
    c.mappers[1].ingest_once()
    for reducer in c.reducers.values():
        assert reducer.run_once()  # commits rows of the short batch; nothing persisted yet
    assert first.persisted.input_unread_row_index == 0
    visible[0] = ROWS_PER_PARTITION  # more rows arrive
    if replay == "restart":
        c.handlers.clear()
        c.start_mapper(0)
        c.start_mapper(1)
    else:
        second = c.start_mapper(0)  # a second live instance, now the freshest in discovery
        second.ingest_once()
        second.ingest_once()  # follows the recorded [100, 150), not [100, 200)
        window = second.window
        assert window is not None
        assert window.snapshot().input_end_row_index == 150
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    txn = c.store.create_transaction()
    try:
        assert txn.get_range_startswith(("sys", "plan")) == []  # cleared once persisted
    finally:
        txn.reset()
    c.store.close()


class CountCommits(CountRows):
    """Counts rows like :class:`CountRows` and records what each commit covered."""

    def __init__(self, spec: ms.WorkerSpec, config: dict[str, object]) -> None:
        super().__init__(spec, config)
        self.pending = 0
        self.committed: list[int] = []

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        super().reduce(batch, txn)
        self.pending = batch.num_rows

    def on_commit(self) -> None:
        self.committed.append(self.pending)
        if self.config.get("fail_on_commit"):
            raise RuntimeError("on_commit failed")


@pytest.mark.parametrize("fail", [False, True])
def test_on_commit_follows_every_commit_and_only_commits(tmp_path: Path, fail: bool) -> None:
    c = Cluster(tmp_path, _tables(), reducer=CountCommits, config={"fail_on_commit": fail})
    for mapper in c.mappers.values():
        mapper.ingest_once()
    reducer = c.reducers[0]
    user = reducer.user
    assert isinstance(user, CountCommits)
    # A twin commits first: this reducer's transaction fails and on_commit is not called.
    twin = ReducerWorker(c.processor, 0, c.store, InProcessTransport(c.handlers), clock=c.clock)
    state, _, _ = reducer._read_view()
    assert twin.run_once()
    assert not _commit_one_row(reducer, state)
    assert user.committed == []
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    assert len(user.committed) == reducer.commits > 0
    assert sum(user.committed) == reducer.rows_reduced
    assert ("on_commit failed" in reducer.last_error) == fail


@pytest.mark.parametrize("next_round", [True, False], ids=["next-round calls", "0-row calls"])
def test_on_commit_runs_before_the_mappers_hear_of_the_commit(
    tmp_path: Path, next_round: bool
) -> None:
    """The user hears of a commit as soon as it lands: telling the mappers (the next
    round's calls, or 0-row calls) comes after, so on_commit still sees their windows hold
    the committed rows."""
    c = Cluster(tmp_path, _tables(), num_reducers=1, gather_seconds=0.0)
    for mapper in c.mappers.values():
        mapper.ingest_once()
    reducer = c.reducers[0]
    held: list[list[int]] = []

    def buffered() -> list[int]:
        return [m.window.snapshot().buffered_rows for m in c.mappers.values() if m.window]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reducer.user, "on_commit", lambda: held.append(buffered()))
        if not next_round:
            patch.setattr(reducer, "_send_next_round", lambda state, live: False)
        assert reducer.run_once()
    assert held == [[BATCH_ROWS, BATCH_ROWS]]
    assert buffered() == [0, 0]
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    c.store.close()


class SlowCountRows(CountRows):
    """Counts rows, computing for six seconds (on the store's clock) after its first read."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        txn.get(("n", 0))  # a read: the transaction's clock is running
        self.config["clock"].advance(6.0)  # longer than the 5 s transaction limit
        self.config["beat"]()  # the mappers' heartbeats go on meanwhile
        super().reduce(batch, txn)


def test_a_reduce_longer_than_the_transaction_limit_commits(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), reducer=SlowCountRows)
    c.store.clock = c.clock.now  # the store's 5 s limit runs on the test's clock
    beats = [
        Heartbeat(c.store, "mapper", m, w.guid, f"mapper-{m}-{w.guid}", 1.0, w.metrics)
        for m, w in c.mappers.items()
    ]

    def beat_all() -> None:
        for heartbeat in beats:
            heartbeat.beat()

    for reducer in c.reducers.values():
        reducer.user.config = {"clock": c.clock, "beat": beat_all}
    c.run_to_end(limit=100)
    assert c.output() == _expected(c.tables)
    assert all(r.renewals >= r.commits > 0 for r in c.reducers.values())
    c.store.close()


class ReadModifyWriteTotal(ms.Reducer):
    """Adds the batch's rows to a total it reads and writes back; slow on its first call."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        total = txn.get_int(("total",))
        during = self.config.get("during")
        if during is not None:
            self.config = {}
            during()
        txn.set(("total",), encode_int64(total + batch.num_rows))


def test_a_long_reduce_whose_reads_changed_meanwhile_is_not_committed(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), num_reducers=1, reducer=ReadModifyWriteTotal)
    c.store.clock = c.clock.now

    def slow_while_another_writer_adds() -> None:
        c.clock.advance(6.0)
        c.store.transact(lambda txn: txn.add((*OUTPUT, "total"), 1000))

    c.reducers[0].user.config = {"during": slow_while_another_writer_adds}
    c.run_to_end(limit=100)
    # The first reduce read the total before the other writer's 1000: committing its write
    # would lose them. Its replay saw the change, and the rows were reduced again.
    rows = sum(t.num_rows for t in c.tables)
    txn = c.store.create_transaction()
    try:
        assert decode_int64(txn.get((*OUTPUT, "total")) or b"") == 1000 + rows
    finally:
        txn.reset()
    assert c.reducers[0].split_brains >= 1
    c.store.close()


def test_reducers_follow_the_newest_instance_whatever_the_clocks(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, _tables())
    try:
        old = cluster.mappers[0]
        # The old instance's host clock runs an hour ahead: its last beat, before it died,
        # carries a later time than anything the new instance writes.
        skewed = cluster.clock.wall() + 3600
        cluster.store.transact(
            lambda txn: register_worker(txn, "mapper", 0, old.guid, f"mapper-0-{old.guid}", skewed)
        )
        cluster.handlers.pop(f"mapper-0-{old.guid}")
        new = cluster.start_mapper(0)
        new.ingest_once()
        reducer = cluster.reducers[0]
        assert reducer.run_once(), reducer.last_error
        assert reducer.last_state is not None
        assert reducer.last_state.committed_row_indices[0] >= 0
    finally:
        cluster.store.close()


def test_a_zombie_that_beats_again_does_not_take_over(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, _tables())
    try:
        old = cluster.mappers[0]
        address = f"mapper-0-{old.guid}"
        zombie = Heartbeat(cluster.store, "mapper", 0, old.guid, address, 1.0, old.metrics)
        zombie.beat()
        new = cluster.start_mapper(0)  # supersedes the old entry (removes it)
        zombie.beat()  # the old instance is still alive and re-creates its entry
        cluster.handlers.pop(f"mapper-0-{old.guid}")  # ... and stops serving
        new.ingest_once()
        reducer = cluster.reducers[0]
        assert reducer.run_once(), reducer.last_error
        txn = cluster.store.create_transaction()
        try:
            entries = {w.guid: w for w in list_workers(txn, "mapper") if w.index == 0}
        finally:
            txn.reset()
        assert entries[old.guid].registration < entries[new.guid].registration
    finally:
        cluster.store.close()


def test_reducers_forget_mappers_that_stopped_beating(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, _tables())
    try:
        live = cluster.mappers[0]
        dead = cluster.start_mapper(0)  # registers after the live one, then dies
        cluster.handlers.pop(f"mapper-0-{dead.guid}")
        cluster.mappers[0] = live
        reducer = cluster.reducers[0]
        for _ in range(11):  # past the ten heartbeat periods after which an entry is dead
            # The live instance beats every second; the dead one's entry stays as it was.
            cluster.clock.advance(1.0)
            cluster.store.transact(
                lambda txn: register_worker(
                    txn, "mapper", 0, live.guid, f"mapper-0-{live.guid}", cluster.clock.wall()
                )
            )
            live.ingest_once()
            reducer.run_once()
        assert reducer.last_state is not None
        assert reducer.last_state.committed_row_indices[0] >= 0
        txn = cluster.store.create_transaction()
        try:
            assert [w.guid for w in list_workers(txn, "mapper") if w.index == 0] == [live.guid]
        finally:
            txn.reset()
    finally:
        cluster.store.close()


def test_a_mapper_of_the_shape_before_a_rescale_stops(tmp_path: Path) -> None:
    # A mapper instance left running across a rescale (its workers should have been
    # stopped) must not serve rows bucketed for the old reducers: the handover gives every
    # mapper state a new version, so the old instance sees split brain, restarts and finds
    # the new count.
    c = Cluster(tmp_path, _tables())
    old = c.mappers[0]
    c.store.transact(lambda txn: check_processor_info(txn, c.processor.info))
    c.step()
    old.ingest_once()
    c.reducers[0].run_once()  # rows reducer 0 committed and reducer 1 did not
    plan = c.store.transact(lambda txn: begin_rescale(txn, c.processor.info, 3))
    with c.store.read() as txn:
        assert plan.committed[0] >= read_mapper_state(txn, 0).shuffle_unread_row_index
    for m in range(c.processor.num_partitions):  # the rescale's run: fresh workers
        c.start_mapper(m)
    c.run_to_end()  # ... commit every row up to there, and no further
    with c.store.read() as txn:
        persisted = read_mapper_state(txn, 0)
    assert persisted.shuffle_unread_row_index > plan.committed[0]
    assert persisted.input_unread_row_index < ROWS_PER_PARTITION
    zombie = MapperWorker(c.processor, 1, c.store, clock=c.clock)
    zombie.start_ingestion()  # in step with the store until the handover
    c.store.transact(lambda txn: finish_rescale(txn, plan))
    with pytest.raises(SplitBrainError):
        old.ingest_once()
    with pytest.raises(SplitBrainError):
        zombie.trim_input_rows()
    with pytest.raises(ConfigurationError, match="now has 3 reducers"):
        zombie.start_ingestion()
    with pytest.raises(ConfigurationError, match="now has 3 reducers"):
        old.start_ingestion()


def test_reducer_rounds_start_one_commit_interval_apart_whatever_they_take(
    tmp_path: Path,
) -> None:
    """The interval runs from the start of a round that committed: rows that reach a mapper
    while a round fetches and commits wait one interval at most, not the interval plus the
    round's own time."""
    c = Cluster(tmp_path, _tables(), commit_interval_seconds=1.0, commit_time_share=1.0)
    worker = c.reducers[0]
    starts: list[float] = []
    stop = threading.Event()

    def run_once() -> bool:
        starts.append(c.clock.now())
        c.clock.advance(0.6)  # a round that fetches and commits for 0.6 s
        worker.last_transaction_seconds = 0.5
        worker.behind = worker.capped = False  # the mappers keep up: the cadence applies
        if len(starts) == 4:
            stop.set()
        return True

    worker.run_once = run_once  # type: ignore[method-assign]
    worker.run(stop)
    assert [round(b - a, 6) for a, b in itertools.pairwise(starts)] == [1.0, 1.0, 1.0]
    c.store.close()


def test_reducer_status_says_where_its_time_went(tmp_path: Path) -> None:
    """Store transactions, ``reduce`` and waiting for mappers are timed apart: ``reduce``
    runs inside the commit's transaction but counts as ``reduce`` only."""
    c = Cluster(tmp_path, _tables())
    for mapper in c.mappers.values():
        mapper.ingest_once()
    worker = c.reducers[0]
    worker.time_spent = TimeSpent(*REDUCER_ACTIVITIES, clock=c.clock.now)
    client, store, user = worker.rows_client, c.store, worker.user

    def taking(seconds: float, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            c.clock.advance(seconds)
            return call(*args, **kwargs)

        return timed

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "read", taking(0.125, store.read))  # the view, the spills
        patch.setattr(client, "get_rows_many", taking(0.25, client.get_rows_many))
        patch.setattr(client, "acknowledge_many", taking(0.0625, client.acknowledge_many))
        patch.setattr(user, "reduce", taking(0.5, user.reduce))
        assert worker.run_once()
    figures = worker.metrics()
    assert figures["seconds_store"] == 0.25
    assert figures["seconds_reduce"] == 0.5
    assert figures["seconds_mapper_wait"] == 0.3125
    c.store.close()


def test_a_reducer_sends_its_next_rounds_calls_right_after_a_commit(tmp_path: Path) -> None:
    """A reducer whose next round waits for the commit cadence sends that round's GetRows
    right after its commit: they tell the mappers of the commit at once (no 0-row calls)
    and are answered when the round starts, with the rows that came meanwhile."""
    c = Cluster(tmp_path, _tables(), num_reducers=1, gather_seconds=0.0)
    for mapper in c.mappers.values():
        mapper.ingest_once()
    reducer = c.reducers[0]
    client = reducer.rows_client
    assert isinstance(client, InProcessTransport)
    sent: list[Any] = []

    def prefetch(calls: Any) -> None:
        sent.extend(calls)
        InProcessTransport.prefetch(client, calls)

    def acknowledge_many(calls: Any) -> None:
        raise AssertionError(f"0-row calls sent: {calls}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(client, "prefetch", prefetch)
        patch.setattr(client, "acknowledge_many", acknowledge_many)
        assert reducer.run_once()
        assert [call.start_in_seconds for call in sent] == [reducer.cadence.interval] * 2
        assert [call.committed_row_index for call in sent] == [BATCH_ROWS - 1] * 2
        for mapper in c.mappers.values():
            window = mapper.window
            assert window is not None
            assert window.snapshot().buffered_rows == 0  # the commit reached the mapper
            mapper.ingest_once()  # rows that come before the next round
        assert reducer.run_once()  # ... are in its answers
    with c.store.read() as txn:
        assert read_reducer_state(txn, 0, 2).committed_row_indices == (2 * BATCH_ROWS - 1,) * 2
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    c.store.close()
