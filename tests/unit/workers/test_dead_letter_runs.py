"""Dead letters end to end in one process: every good row's effect once, every poison row
of ``map`` and of ``reduce`` recorded once, also when a mapper replays its batch; the cap
stops the run; a batch that does not raise is handled as without dead letters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import DeadLetterCapError, UserCodeError
from millstream.ledger import reduced_key
from millstream.ledger.dead_letters import dead_letter_counts, read_dead_letters
from millstream.state import decode_int64
from millstream.testing import MemoryInput, run_in_process

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
from tests.support.jobs import read_output
from tests.support.worker_fixtures import Cluster

ROWS = 2_000


def processor(
    tmp_path: Path,
    tables: list[pa.Table],
    reducer: type[ms.Reducer] = PoisonedSum,
    **tuning: Any,
) -> ms.Processor:
    return ms.Processor(
        mapper=PoisonedPassThrough,
        reducer=reducer,
        input=MemoryInput(tables),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=2,
        tuning=ms.Tuning(**{"batch_rows": 300, "on_user_error": "dead_letter", **tuning}),
    )


def letters_of(p: ms.Processor) -> list[ms.DeadLetter]:
    with p.open_store() as store, store.read() as txn:
        return ms.read_dead_letters(txn)


@pytest.mark.parametrize("reducer", [PoisonedSum, PoisonedQueueSum], ids=["reduce", "process"])
def test_poison_rows_become_dead_letters_once_and_every_other_row_commits(
    tmp_path: Path, reducer: type[ms.Reducer]
) -> None:
    tables = poisoned_tables(2, ROWS)
    p = processor(tmp_path, tables, reducer)
    run_in_process(p)
    everything = pa.concat_tables(tables)
    assert read_output(p, "sum") == good_sums(everything)
    letters = letters_of(p)
    mapped = [d for d in letters if d.stage == "map"]
    reduced = [d for d in letters if d.stage == "reduce"]
    assert sorted(d.row["value"][0].as_py() for d in mapped) == poison_values(
        everything, MAP_POISON
    )
    assert sorted(d.row["value"][0].as_py() for d in reduced) == poison_values(
        everything, REDUCE_POISON
    )
    for d in mapped:  # the key is the row's input index in its partition
        assert d.row["value"][0].as_py() == d.partition * ROWS + d.index
        assert "map cannot take value" in d.error
    for d in reduced:
        assert d.row.schema == tables[0].schema
        assert d.reducer in (0, 1)
        assert d.row["value"][0].as_py() // ROWS == d.partition
        assert "cannot take value" in d.error
    with p.open_store() as store, store.read() as txn:
        counts = dead_letter_counts(txn)
    assert sum(n for (stage, _), n in counts.items() if stage == "map") == len(mapped)
    assert sum(n for (stage, _), n in counts.items() if stage == "reduce") == len(reduced)


def test_a_replayed_batch_rewrites_its_dead_letters_without_counting_them_again(
    tmp_path: Path,
) -> None:
    tables = poisoned_tables(1, 1_000)
    cluster = Cluster(
        tmp_path,
        tables,
        num_reducers=1,
        mapper=PoisonedPassThrough,
        reducer=PoisonedSum,
        on_user_error="dead_letter",
    )
    cluster.mappers[0].ingest_once()  # rows [0, 100): value 17 raises
    cluster.start_mapper(0)  # a new instance: the state persisted nothing yet
    assert cluster.mappers[0].ingest_once()  # the same batch again
    with cluster.store.read() as txn:
        assert [d.index for d in read_dead_letters(txn)] == [17]
        assert dead_letter_counts(txn) == {("map", 0): 1}
    cluster.run_to_end()
    assert read_output(cluster.processor, "sum") == good_sums(tables[0])
    with cluster.store.read() as txn:
        assert dead_letter_counts(txn) == {
            ("map", 0): len(poison_values(tables[0], MAP_POISON)),
            ("reduce", 0): len(poison_values(tables[0], REDUCE_POISON)),
        }


@pytest.mark.parametrize("reducer", [PoisonedSum, PoisonedQueueSum], ids=["reduce", "process"])
def test_past_the_count_cap_the_run_stops_committing_nothing_of_that_batch(
    tmp_path: Path, reducer: type[ms.Reducer]
) -> None:
    p = processor(tmp_path, poisoned_tables(2, ROWS), reducer, dead_letter_max_rows=5)
    with pytest.raises(DeadLetterCapError, match=r"over tuning.dead_letter_max_rows \(5\)"):
        run_in_process(p)
    assert 0 < len(letters_of(p)) <= 5


def test_past_the_share_cap_the_run_stops(tmp_path: Path) -> None:
    p = processor(tmp_path, poisoned_tables(1, ROWS), dead_letter_max_share=0.001)
    with pytest.raises(DeadLetterCapError, match=r"among its 300 rows, over .*max_share"):
        run_in_process(p)
    assert letters_of(p) == []


def test_a_whole_batch_of_poison_moves_the_mapper_past_it(tmp_path: Path) -> None:
    table = pa.table({"key": pa.array([1, 2, 3], pa.int64()), "value": [17, 217, 417]})
    p = processor(tmp_path, [table, poisoned_tables(1, 10)[0]])
    run_in_process(p)
    assert [d.index for d in letters_of(p)] == [0, 1, 2]
    assert read_output(p, "sum") == good_sums(poisoned_tables(1, 10)[0])


class CountingPassThrough(PoisonedPassThrough):
    calls = 0

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        type(self).calls += 1
        return super().map(batch)


class CountingSum(PoisonedSum):
    calls = 0

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        type(self).calls += 1
        super().reduce(batch, txn)


def test_batches_that_do_not_raise_cost_one_call_each(tmp_path: Path) -> None:
    table = pa.table({"key": pa.array(range(900), pa.int64()), "value": [1] * 900})
    p = ms.Processor(
        mapper=CountingPassThrough,
        reducer=CountingSum,
        input=MemoryInput([table]),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=1,
        tuning=ms.Tuning(batch_rows=300, on_user_error="dead_letter"),
    )
    run_in_process(p)
    assert CountingPassThrough.calls == 3
    with p.open_store() as store, store.read() as txn:
        raw = txn.get(reduced_key(0, "commits"))
    assert raw is not None
    assert CountingSum.calls == decode_int64(raw) > 0  # one reduce per commit, none to bisect
    assert letters_of(p) == []


def test_a_map_that_fails_only_on_rows_together_stops_the_run(tmp_path: Path) -> None:
    class Crowded(PoisonedPassThrough):
        def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
            if batch.num_rows > 1:
                raise MemoryError("too many rows")
            return super().map(batch)

    p = ms.Processor(
        mapper=Crowded,
        reducer=PoisonedSum,
        input=MemoryInput(poisoned_tables(1, 10)),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=1,
        tuning=ms.Tuning(on_user_error="dead_letter"),
    )
    with pytest.raises(UserCodeError, match="on none of them alone"):
        run_in_process(p)


def test_the_setting_is_checked(tmp_path: Path) -> None:
    tables = poisoned_tables(1, 10)
    with pytest.raises(ms.exceptions.ConfigurationError, match="'dead_letter', got 'skip'"):
        processor(tmp_path, tables, on_user_error="skip")
    with pytest.raises(ms.exceptions.ConfigurationError, match="dead_letter_max_share"):
        processor(tmp_path, tables, dead_letter_max_share=2.0)
    with pytest.raises(ms.exceptions.ConfigurationError, match="dead_letter_max_rows"):
        processor(tmp_path, tables, dead_letter_max_rows=-1)
