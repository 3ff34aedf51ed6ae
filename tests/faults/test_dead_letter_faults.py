"""A failed store write at the commit that carries dead letters: nothing of the batch is
lost or doubled. The store is the SQLite backend on a connection whose ``COMMIT``
statements fail with a disk I/O error (``tests/support/sqlite_faults.py``), armed by the
dead-letter write itself so that exactly the transaction holding them fails.

- A mapper's: the batch's rows do not enter the window, no record lands, and the batch is
  mapped again and its dead letters recorded once.
- A reducer's (``reduce``, or a queue reducer's ``process``): the good rows' effects, the
  dead letters and the committed indices are dropped together; the next round commits
  them together, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import StoreUnavailableError
from millstream.ledger import register_worker
from millstream.ledger.dead_letters import dead_letter_counts, read_dead_letters
from millstream.testing import InProcessTransport, ManualClock, MemoryInput
from millstream.workers import MapperWorker, ReducerWorker
from millstream.workers.mapper_worker import map_dead_letters
from millstream.workers.reducer_worker import reduce_dead_letters

from tests.support.dead_letter_jobs import (
    MAP_POISON,
    REDUCE_POISON,
    PoisonedPassThrough,
    PoisonedQueueSum,
    PoisonedSum,
    good_sums,
    poison_values,
    poisoned_tables,
)
from tests.support.sqlite_faults import PLAN, FaultyConnection, FaultyStore
from tests.support.worker_fixtures import output_counts

ROWS = 1_000


@pytest.fixture
def disarmed() -> Iterator[None]:
    PLAN.arm(None)
    yield
    PLAN.arm(None)


def fail_commit_after_writing(module: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the commit of the next transaction that records dead letters fail (every
    ``COMMIT`` from then on, until disarmed: a read's release, then the write's own)."""
    armed: list[int] = []
    real = module.record_within_cap

    def record_then_fail(*args: Any) -> int:
        new = real(*args)
        if not armed:
            armed.append(new)
            PLAN.arm(0, match="COMMIT", every=1)
        return int(new)

    monkeypatch.setattr(module, "record_within_cap", record_then_fail)
    return armed


def setup(
    tmp_path: Path, reducer: type[ms.Reducer] = PoisonedSum
) -> tuple[ms.Processor, FaultyStore, list[pa.Table]]:
    tables = poisoned_tables(1, ROWS)
    processor = ms.Processor(
        mapper=PoisonedPassThrough,
        reducer=reducer,
        config={"gather_rows": 1},  # a queue reducer finishes its rows every round
        input=MemoryInput(tables),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=1,
        tuning=ms.Tuning(batch_rows=250, on_user_error="dead_letter"),
    )
    store = FaultyStore(
        processor.store,
        str(tmp_path / "state.db"),
        (processor.name,),
        connection_factory=FaultyConnection,
    )
    return processor, store, tables


def stored(store: FaultyStore) -> tuple[list[int], list[int], dict[tuple[str, int], int]]:
    with store.read() as txn:
        letters = read_dead_letters(txn)
        counts = dead_letter_counts(txn)
    values = [
        [int(d.row["value"][0].as_py()) for d in letters if d.stage == s] for s in ("map", "reduce")
    ]
    return sorted(values[0]), sorted(values[1]), counts


def test_a_failed_mapper_dead_letter_commit_pushes_nothing_and_is_redone_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disarmed: None
) -> None:
    processor, store, tables = setup(tmp_path)
    mapper = MapperWorker(processor, 0, store, clock=ManualClock())
    mapper.start_ingestion()
    armed = fail_commit_after_writing(map_dead_letters, monkeypatch)
    with pytest.raises(StoreUnavailableError, match="disk I/O error"):
        mapper.ingest_once()
    PLAN.arm(None)
    assert armed == [2]  # values 17 and 217 of the first 250 rows, written, then lost
    assert mapper.window is not None
    assert mapper.window.snapshot().input_end_row_index == 0  # nothing of the batch
    assert stored(store) == ([], [], {})
    while not mapper.end_of_input:
        mapper.ingest_once()
    assert mapper.window.snapshot().input_end_row_index == ROWS
    map_values, _, counts = stored(store)
    assert map_values == poison_values(tables[0], MAP_POISON)
    assert counts == {("map", 0): len(map_values)}


@pytest.mark.parametrize("reducer", [PoisonedSum, PoisonedQueueSum], ids=["reduce", "process"])
def test_a_failed_reducer_dead_letter_commit_drops_the_round_whole_and_redoes_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disarmed: None, reducer: type[ms.Reducer]
) -> None:
    processor, store, tables = setup(tmp_path, reducer)
    clock = ManualClock()
    mapper = MapperWorker(processor, 0, store, clock=clock)
    mapper.start_ingestion()
    transport = InProcessTransport()
    transport.bind("in-process:mapper-0", mapper)
    store.transact(
        lambda txn: register_worker(
            txn, "mapper", 0, mapper.guid, "in-process:mapper-0", clock.wall()
        )
    )
    reducer = ReducerWorker(processor, 0, store, transport, clock=clock)
    mapper.ingest_once()
    armed = fail_commit_after_writing(reduce_dead_letters, monkeypatch)
    with pytest.raises(StoreUnavailableError, match="disk I/O error"):
        reducer.run_once()
    PLAN.arm(None)
    assert armed == [1]  # value 117, the one reduce-poison row of the first 250
    _, reduce_values, _ = stored(store)
    assert reduce_values == []
    assert output_counts(processor.store, processor.name, "sum") == {}
    for _ in range(50):
        if mapper.is_drained():
            break
        if not mapper.end_of_input:
            mapper.ingest_once()
        reducer.run_once()
        mapper.trim_input_rows()
    assert mapper.is_drained()
    assert output_counts(processor.store, processor.name, "sum") == good_sums(tables[0])
    map_values, reduce_values, counts = stored(store)
    assert map_values == poison_values(tables[0], MAP_POISON)
    assert reduce_values == poison_values(tables[0], REDUCE_POISON)
    assert counts == {("map", 0): len(map_values), ("reduce", 0): len(reduce_values)}
