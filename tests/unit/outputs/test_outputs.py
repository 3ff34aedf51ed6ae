"""Outputs committed with the reducer's transaction: a queue another processor reads (a
pipeline) and a Parquet sink, driven in one process, with a failure at each step of
publishing."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest
from millstream.exceptions import CommitUnknownResultError, ConfigurationError, InputError
from millstream.inputs import StoreQueue
from millstream.outputs import STAGING, ParquetSink
from millstream.state.replay import ReplayingTransaction
from millstream.testing import MemoryInput, run_in_process

from tests.support.worker_fixtures import (
    ConflictingCommits,
    PassThrough,
    expected_counts,
    output_counts,
    tables,
)


class CountsToQueue(ms.Reducer):
    """Counts each key of the batch and appends ``(key, n)`` rows to the output queue."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        counts = pa.Table.from_batches([batch]).group_by("key", use_threads=False)
        table = counts.aggregate([([], "count_all")]).rename_columns(["key", "n"])
        txn.append("partials", table)


class AddPartials(ms.Reducer):
    """Adds the ``(key, n)`` rows of the first stage under ``("n", key)``."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        txn.add_many(("n",), batch["key"], batch["n"])


class RowsToFiles(ms.Reducer):
    """Publishes every batch it reduces as one Parquet file of ``config["sink"]``."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        txn.write_parquet(self.config["sink"], batch)


def _first_stage(tmp_path: Path, data: list[pa.Table]) -> tuple[ms.Processor, StoreQueue]:
    """Counts per key appended to the queue ``partials`` (two partitions)."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    partials = StoreQueue(url, "partials", 2)
    first = ms.Processor(
        mapper=PassThrough,
        reducer=CountsToQueue,
        input=MemoryInput(data),
        store=url,
        num_reducers=2,
        name="first",
        outputs=[partials],
        tuning=ms.Tuning(batch_rows=100),
    )
    return first, partials


def test_a_pipeline_of_two_processors_counts_every_row_once(tmp_path: Path) -> None:
    data = tables(3)
    first, partials = _first_stage(tmp_path, data)
    url = first.store
    second = ms.Processor(
        mapper=PassThrough,
        reducer=AddPartials,
        input=partials,
        store=url,
        num_reducers=2,
        name="second",
        tuning=ms.Tuning(batch_rows=100),
    )
    run_in_process(first)
    assert all(partials.is_sealed(p) for p in range(2)), "a drained processor seals its outputs"
    appended = sum(partials.end_row_index(p) for p in range(2))
    assert appended > 0
    run_in_process(second)
    assert output_counts(url, "second") == expected_counts(data)
    assert all(partials.first_row_index(p) == partials.end_row_index(p) for p in range(2)), (
        "the second processor trims what it consumed"
    )


def test_rows_of_a_commit_that_failed_never_reach_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tables(2)
    first, partials = _first_stage(tmp_path, data)
    ConflictingCommits(every=3).install(monkeypatch)
    run_in_process(first)
    batches = [partials.read(p, 0, 1_000_000).batch for p in range(2)]
    appended = pa.Table.from_batches([b for b in batches if b is not None])
    totals = appended.group_by("key").aggregate([("n", "sum")])
    got = dict(zip(totals["key"].to_pylist(), totals["n_sum"].to_pylist(), strict=True))
    assert got == expected_counts(data)


def test_outputs_must_be_declared_and_live_in_the_processors_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    elsewhere = StoreQueue(f"sqlite:///{tmp_path / 'other.db'}", "partials", 2)
    with pytest.raises(ConfigurationError, match="must live in the same store"):
        ms.Processor(
            mapper=PassThrough,
            reducer=CountsToQueue,
            input=MemoryInput(tables()),
            store=url,
            num_reducers=2,
            outputs=[elsewhere],
        )
    queue = StoreQueue(url, "q", 2)
    with pytest.raises(ConfigurationError, match="cannot append to the queue it reads"):
        ms.Processor(
            mapper=PassThrough,
            reducer=CountsToQueue,
            input=queue,
            store=url,
            num_reducers=2,
            outputs=[queue],
        )
    undeclared = ms.Processor(
        mapper=PassThrough,
        reducer=CountsToQueue,
        input=MemoryInput(tables()),
        store=url,
        num_reducers=2,
        outputs=[queue],
    )
    with pytest.raises(ms.exceptions.UserCodeError, match="'partials' is not among"):
        run_in_process(undeclared)
    assert all(queue.end_row_index(p) == 0 for p in range(2))


def test_rows_of_another_schema_are_refused_and_nothing_commits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    partials = StoreQueue(url, "partials", 2)
    partials.append(0, pa.table({"word": ["a"]}))
    processor = ms.Processor(
        mapper=PassThrough,
        reducer=CountsToQueue,
        input=MemoryInput(tables()),
        store=url,
        num_reducers=1,
        outputs=[partials],
    )
    with pytest.raises(InputError, match="shares no column with the earlier rows' \\(word\\)"):
        run_in_process(processor)
    assert partials.end_row_index(0) == 1
    assert output_counts(url, "millstream") == {}


def _sink_job(tmp_path: Path, data: list[pa.Table]) -> tuple[ms.Processor, ParquetSink]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    sink = ParquetSink(url, "rows", str(tmp_path / "out"))
    processor = ms.Processor(
        mapper=PassThrough,
        reducer=RowsToFiles,
        input=MemoryInput(data),
        store=url,
        num_reducers=2,
        config={"sink": sink},
        outputs=[sink],
        tuning=ms.Tuning(batch_rows=100),
    )
    return processor, sink


def _published_keys(sink: ParquetSink) -> list[int]:
    return sorted(sink.read()["key"].to_pylist())


def _input_keys(data: list[pa.Table]) -> list[int]:
    return sorted(pa.concat_tables(data)["key"].to_pylist())


def test_a_sink_publishes_every_row_once_and_plain_readers_see_the_same(tmp_path: Path) -> None:
    data = tables(2)
    processor, sink = _sink_job(tmp_path, data)
    run_in_process(processor)
    assert _published_keys(sink) == _input_keys(data)
    plain = pads.dataset(str(tmp_path / "out"), format="parquet").to_table()
    assert sorted(plain["key"].to_pylist()) == _input_keys(data)
    assert not list((tmp_path / "out" / STAGING).iterdir())


def test_a_failed_commit_publishes_nothing_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tables(2)
    processor, sink = _sink_job(tmp_path, data)
    ConflictingCommits(every=2).install(monkeypatch)
    run_in_process(processor)
    assert _published_keys(sink) == _input_keys(data)
    assert not list((tmp_path / "out" / STAGING).iterdir()), "failed attempts' files deleted"


def test_a_crash_between_commit_and_rename_is_published_by_the_next_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tables(2)
    processor, sink = _sink_job(tmp_path, data)
    real = ParquetSink.publish
    calls = 0

    def dies_on_the_third(self: ParquetSink, staged: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise SystemExit("killed after the commit, before the rename")
        real(self, staged)  # type: ignore[arg-type]

    monkeypatch.setattr(ParquetSink, "publish", dies_on_the_third)
    with pytest.raises(SystemExit):
        run_in_process(processor)
    staged = list((tmp_path / "out" / STAGING).iterdir())
    assert len(staged) == 1, "the recorded file waits in the staging directory"
    assert staged[0].name in sink.recorded()
    monkeypatch.setattr(ParquetSink, "publish", real)
    run_in_process(processor)  # the new instances resume from the committed indices
    assert _published_keys(sink) == _input_keys(data)
    assert not list((tmp_path / "out" / STAGING).iterdir())


def test_a_commit_with_an_unknown_outcome_that_landed_publishes_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tables(2)
    processor, sink = _sink_job(tmp_path, data)
    real = ReplayingTransaction.commit
    calls = 0

    def lands_then_reports_unknown(self: ReplayingTransaction) -> None:
        nonlocal calls
        calls += 1
        real(self)
        if calls == 2:
            raise CommitUnknownResultError("the connection dropped during the commit")

    monkeypatch.setattr(ReplayingTransaction, "commit", lands_then_reports_unknown)
    with pytest.raises(CommitUnknownResultError):
        run_in_process(processor)
    monkeypatch.setattr(ReplayingTransaction, "commit", real)
    run_in_process(processor)
    assert _published_keys(sink) == _input_keys(data)


def test_vacuum_removes_staged_files_no_commit_recorded(tmp_path: Path) -> None:
    data = tables(1)
    processor, sink = _sink_job(tmp_path, data)
    orphan = sink.stage(pa.table({"key": pa.array([-5], pa.int64())}), "reducer-9")
    run_in_process(processor)
    assert orphan.name not in sink.recorded()
    assert sink.vacuum(older_than_seconds=3600) == [], "a young file may be a commit under way"
    assert sink.vacuum(older_than_seconds=0) == [orphan.name]
    assert _published_keys(sink) == _input_keys(data)
    assert pc.min(sink.read()["key"]).as_py() >= 0
