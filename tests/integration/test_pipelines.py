"""Outputs end to end, under kill -9: a two-stage pipeline through a store queue, and a
Parquet sink, each exact whatever is killed (workers, the fork server) and when."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pyarrow.dataset as pads
import pytest
from millstream.inputs import StoreQueue
from millstream.outputs import ParquetSink
from millstream.runner.pipeline import PipelineRunner

from tests.support.chaos import RandomKiller, run_killed
from tests.support.jobs import (
    KeyedSumReducer,
    PassThroughMapper,
    RowsToSinkReducer,
    SlowKeyedSumMapper,
    SlowPassThroughMapper,
    SumsToQueueReducer,
    expected_sums,
    input_table,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)
from tests.support.stores import ON_FDB

CHAOS = tuning(
    batch_rows=2_000,
    memory_limit_bytes=400_000,
    commit_interval_seconds=0.1,
    restart=ms.RestartStrategy(max_restarts=1_000),
)


def _pipeline(
    tmp_path: Path, rows: int, state_url: str | None = None
) -> tuple[ms.Processor, ms.Processor, Path]:
    data = write_keyed_input(tmp_path / "in", rows, partitions=2)
    state = state_url or f"sqlite:///{tmp_path / 'state.db'}"
    partials = StoreQueue(state, "partials", 2)
    first = keyed_processor(
        data,
        state,
        mapper=SlowKeyedSumMapper,
        reducer=SumsToQueueReducer,
        name="first",
        config={"queue": "partials", "map_seconds": 0.04},
        tune=CHAOS,
    )
    first = ms.Processor(**{**first.__dict__, "outputs": [partials]})
    second = ms.Processor(
        mapper=PassThroughMapper,
        reducer=KeyedSumReducer,
        input=partials,
        store=first.store,
        num_reducers=3,
        name="second",
        tuning=CHAOS,
    )
    return first, second, data


def test_a_pipeline_without_failures_is_exact(tmp_path: Path) -> None:
    first, second, data = _pipeline(tmp_path, 40_000)
    first = ms.Processor(**{**first.__dict__, "config": {"queue": "partials", "map_seconds": 0}})
    summaries = ms.run_local_pipeline([first, second], timeout=180)
    assert [s.drained for s in summaries] == [True, True]
    assert read_output(second, "sum") == expected_sums(data)


@pytest.mark.parametrize(
    ("seed", "state_url"),
    [(1, "sqlite"), (2, "sqlite"), pytest.param(3, *ON_FDB.values, marks=ON_FDB.marks)],
    indirect=["state_url"],
)
def test_a_pipeline_is_exact_under_kill_9(tmp_path: Path, seed: int, state_url: str) -> None:
    first, second, data = _pipeline(tmp_path, 200_000, state_url)
    pipeline = PipelineRunner([first, second])
    pipeline.start()
    killers = [RandomKiller(runner, seed * 10 + i) for i, runner in enumerate(pipeline.runners)]
    with killers[0], killers[1]:
        pipeline.wait(timeout=300)
    assert any(killer.kills for killer in killers), "the killers never found a live process"
    assert read_output(second, "sum") == expected_sums(data)
    print(f"seed {seed}: killed {[k.kills for k in killers]}")


@pytest.mark.parametrize(
    ("seed", "state_url"),
    [(1, "sqlite"), (2, "sqlite"), pytest.param(3, *ON_FDB.values, marks=ON_FDB.marks)],
    indirect=["state_url"],
)
def test_a_parquet_sink_holds_every_row_once_under_kill_9(
    tmp_path: Path, seed: int, state_url: str
) -> None:
    data = write_keyed_input(tmp_path / "in", 200_000, partitions=2, unique_values=True)
    sink = ParquetSink(state_url, "rows", str(tmp_path / "out"))
    processor = keyed_processor(
        data,
        state_url,
        mapper=SlowPassThroughMapper,
        reducer=RowsToSinkReducer,
        config={"sink": "rows", "map_seconds": 0.04},
        tune=CHAOS,
    )
    processor = ms.Processor(**{**processor.__dict__, "outputs": [sink]})
    _, kills = run_killed(processor, seed)
    expected = sorted(input_table(data)["value"].to_pylist())
    assert sorted(sink.read()["value"].to_pylist()) == expected
    orphans = sink.vacuum(older_than_seconds=0)
    plain = pads.dataset(str(tmp_path / "out"), format="parquet").to_table()
    assert sorted(plain["value"].to_pylist()) == expected
    print(f"seed {seed}: killed {kills}; {len(sink.recorded())} files, {len(orphans)} orphans")


def test_the_windowed_pipeline_example_is_exact_under_kill_9(tmp_path: Path) -> None:
    from examples import pipeline

    stages = [
        ms.Processor(**{**stage.__dict__, "tuning": CHAOS})
        for stage in pipeline.make_pipeline(tmp_path, 100_000)
    ]
    runner = PipelineRunner(stages)
    runner.start()
    killers = [RandomKiller(r, 7 + i) for i, r in enumerate(runner.runners)]
    with killers[0], killers[1]:
        runner.wait(timeout=300)
    assert any(killer.kills for killer in killers), "the killers never found a live process"
    assert pipeline.read_top(stages[1]) == pipeline.expected_top(tmp_path, 100_000)
    print(f"killed {[k.kills for k in killers]}")
