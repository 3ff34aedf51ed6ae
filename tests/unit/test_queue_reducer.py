"""The persistent-queue reducer: rows stay pending across commits and are finished as a
prefix per mapper, exactly once, driven in one process (with failing commits too)."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from millstream.exceptions import ConfigurationError
from millstream.testing import MemoryInput, run_in_process

from tests.support.worker_fixtures import (
    ConflictingCommits,
    PassThrough,
    expected_counts,
    output_counts,
    tables,
)


class CountInGroups(ms.QueueReducer):
    """Counts rows per key, ``config["group"]`` rows of a key at a time: rows wait, pending,
    until their key has that many; the rest is counted once every mapper ended.

    Counts only the rows the commit finishes, so a row marked behind an unfinished one
    comes again and is counted then. Records what every round saw, for the assertions.
    """

    rounds: list[tuple[int, int, int]] = []  # noqa: RUF012 (shared on purpose)

    def process(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        keys = pending.rows["key"]
        everyone = len(pending.ended_partitions) == self.spec.num_partitions
        if everyone:
            pending.finish_all()
        else:
            counts = pa.table({"key": keys}).group_by("key").aggregate([([], "count_all")])
            full = counts.filter(pc.greater_equal(counts["count_all"], self.config["group"]))
            pending.finish(pc.is_in(keys, full["key"]))
        done = pending.finished()
        finished = pa.table({"key": keys}).filter(done)
        sums = finished.group_by("key").aggregate([([], "count_all")])
        txn.add_many(("n",), sums["key"].combine_chunks(), sums["count_all"].combine_chunks())
        CountInGroups.rounds.append((len(pending), pending.fetched_rows, finished.num_rows))


def _skewed(partitions: int) -> list[pa.Table]:
    """Keys of uneven frequency, so that keys fill their groups at different times."""
    return [
        pa.table({"key": pa.array([(i * i + 3 * p) % 37 for i in range(1_000)], pa.int64())})
        for p in range(partitions)
    ]


def _processor(tmp_path: Path, data: list[pa.Table], group: int = 40) -> ms.Processor:
    return ms.Processor(
        mapper=PassThrough,
        reducer=CountInGroups,
        input=MemoryInput(data),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=2,
        name="groups",
        config={"group": group},
        tuning=ms.Tuning(batch_rows=100),
    )


def test_pending_rows_wait_across_rounds_and_count_once(tmp_path: Path) -> None:
    CountInGroups.rounds.clear()
    data = _skewed(2)
    processor = _processor(tmp_path, data, group=15)
    run_in_process(processor)
    assert output_counts(processor.store, "groups") == expected_counts(data)
    carried = [r for r in CountInGroups.rounds if r[0] > r[1]]
    assert carried, "rows stayed pending from one round to the next"
    partly = [r for r in CountInGroups.rounds if 0 < r[2] < r[0]]
    assert partly, "some rounds finished part of the pending rows"
    assert sum(finished for _, _, finished in CountInGroups.rounds) == sum(
        t.num_rows for t in data
    ), "every row finished once: the mappers sent each row once"


def test_failed_commits_leave_rows_pending_and_count_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _skewed(3)
    processor = _processor(tmp_path, data, group=25)
    ConflictingCommits(every=3).install(monkeypatch)
    run_in_process(processor)
    assert output_counts(processor.store, "groups") == expected_counts(data)


def test_finish_covers_a_prefix_per_mapper() -> None:
    rows = pa.table({"v": list(range(6))})
    pending = ms.PendingRows(rows, np.array([0, 0, 0, 1, 1, 1], np.int32), frozenset(), 6)
    done = pending.finish([True, False, True, True, True, False])
    assert done.to_pylist() == [True, False, False, True, True, False]
    assert pending.finished_prefix() == {0: 1, 1: 2}
    pending.finish(pa.array([False, True, False, False, False, False]))
    assert pending.finished_prefix() == {0: 3, 1: 2}, "marks add up"
    with pytest.raises(ValueError, match="5 values for 6 pending rows"):
        pending.finish([True] * 5)
    with pytest.raises(ValueError, match="nulls"):
        pending.finish(pa.array([True, None, True, True, True, True]))


def test_a_queue_reducer_needs_exactly_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="needs exactly-once delivery"):
        ms.Processor(
            mapper=PassThrough,
            reducer=CountInGroups,
            input=MemoryInput(tables()),
            store=f"sqlite:///{tmp_path / 'state.db'}",
            num_reducers=2,
            delivery="at_least_once",
        )


class CountWithBlobs(ms.QueueReducer):
    """Finishes every pending row at once and writes a 2 kB value per row with its count."""

    def process(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        pending.finish_all()
        keys = pending.rows["key"].combine_chunks()
        counts = pa.table({"key": keys}).group_by("key").aggregate([([], "count_all")])
        txn.add_many(("n",), counts["key"].combine_chunks(), counts["count_all"].combine_chunks())
        blobs = pa.array([b"x" * 2_000] * len(keys), pa.binary())
        txn.set_many(("blob", len(pending)), pa.array(range(len(keys)), pa.int64()), blobs)


def test_a_round_too_large_for_one_transaction_sees_fewer_rows(tmp_path: Path) -> None:
    from millstream.state.limits import StoreLimits

    from tests.support.worker_fixtures import Cluster

    data = _skewed(2)
    c = Cluster(
        tmp_path, data, reducer=CountWithBlobs, limits=StoreLimits(max_transaction_bytes=200_000)
    )
    for _ in range(4):
        for mapper in c.mappers.values():
            mapper.ingest_once()
    reducer = c.reducers[0]
    assert not reducer.run_once()  # about 400 rows x 2 kB: over the limit
    assert "too large for one transaction" in reducer.last_error
    c.run_to_end()
    assert c.output() == expected_counts(data)
    assert reducer.commits > 1
    c.store.close()
