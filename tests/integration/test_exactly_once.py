"""Exact results end to end: word count and keyed sum, under kill -9 and split brain."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pytest
from millstream.runner.local import LocalRunner

from examples import word_count
from tests.support.chaos import run_killed
from tests.support.jobs import (
    SlowKeyedSumMapper,
    expected_sums,
    expected_word_counts,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)
from tests.support.stores import ON_BOTH, ON_FDB


def test_word_count_is_exact(tmp_path: Path) -> None:
    processor = word_count.make_processor(tmp_path, rows=40_000, tuning=tuning(batch_rows=4_000))
    summary = LocalRunner(processor).run(timeout=120)
    data = word_count.generate(tmp_path, 40_000)
    assert read_output(processor, "count") == expected_word_counts(data)
    assert summary.rows_read == 40_000


def test_keyed_sum_is_exact(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 60_000, partitions=3)
    processor = keyed_processor(data, tmp_path / "state.db", num_reducers=3)
    summary = LocalRunner(processor).run(timeout=120)
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == 60_000
    assert summary.restarts == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "pipeline_fetch", "state_url"),
    [
        *[(seed, fetch, "sqlite") for seed, fetch in [(20240611, False), (1, False), (2, False)]],
        *[(seed, True, "sqlite") for seed in (3, 4, 5)],
        pytest.param(6, True, *ON_FDB.values, marks=ON_FDB.marks),
    ],
    indirect=["state_url"],
)
def test_kill_9_random_processes_many_times(
    tmp_path: Path, seed: int, pipeline_fetch: bool, state_url: str
) -> None:
    data = write_keyed_input(tmp_path / "in", 200_000, partitions=2, file_rows=20_000)
    # A small window and slower commits make the run last seconds, so that the killer finds
    # workers at every stage (workers start in milliseconds from the fork server). Killing
    # the fork server kills every worker with it; such deaths are no crash loop, so the
    # restart strategy allows them all.
    tune = tuning(
        batch_rows=2_000,
        memory_limit_bytes=40_000,
        commit_interval_seconds=0.1,
        restart=ms.RestartStrategy(max_restarts=1_000),
        pipeline_fetch=pipeline_fetch,  # fetching during commits, in half of the runs
    )
    # A map that takes 40 ms a batch keeps the run going for seconds: kills land on workers
    # at work, not on ones that are exiting after the drain (which count no restart).
    processor = keyed_processor(
        data,
        state_url,
        num_reducers=2,
        tune=tune,
        mapper=SlowKeyedSumMapper,
        config={"map_seconds": 0.04},
    )
    summary, kills = run_killed(processor, seed)
    assert summary.restarts > 0
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == 200_000
    print(f"seed {seed}: killed {kills}")


@pytest.mark.parametrize("state_url", ON_BOTH, indirect=True)
@pytest.mark.parametrize(
    "duplicate", [("mapper", 0), ("reducer", 1)], ids=["mapper0x2", "reducer1x2"]
)
def test_split_brain_two_live_instances(
    tmp_path: Path, duplicate: tuple[str, int], state_url: str
) -> None:
    from tests.support.jobs import PassThroughMapper, RowsReducer

    data = write_keyed_input(tmp_path / "in", 60_000, partitions=2)
    processor = keyed_processor(
        data,
        state_url,
        mapper=PassThroughMapper,
        reducer=RowsReducer,
        tune=tuning(batch_rows=2_000, memory_limit_bytes=400_000),
    )
    LocalRunner(processor, instances={duplicate: 2}).run(timeout=180)
    table = __import__("tests.support.jobs", fromlist=["input_table"]).input_table(data)
    counts = table.group_by("key").aggregate([([], "count_all")])
    expected = dict(zip(counts["key"].to_pylist(), counts["count_all"].to_pylist(), strict=True))
    assert read_output(processor, "seen") == expected
