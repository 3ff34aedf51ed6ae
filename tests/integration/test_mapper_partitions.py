"""Mappers over several input partitions: a processor over 8 partitions runs with 2 mapper
workers, is stopped mid-stream and restarted with 3, then 1 (the last two runs under
kill -9): every row's effect is applied exactly once."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path

import millstream as ms
import pyarrow.compute as pc
import pytest
from millstream.exceptions import ConfigurationError
from millstream.runner.local import LocalRunner

from tests.support.chaos import RandomKiller
from tests.support.jobs import (
    RowsReducer,
    SlowPassThroughMapper,
    input_table,
    keyed_processor,
    read_output,
    write_keyed_input,
)

PARTITIONS = 8


def _run_until(runner: LocalRunner, processor: ms.Processor, rows_seen: int) -> int:
    """Run until at least ``rows_seen`` rows are counted (or the input drains); then stop.
    Returns the rows counted when stopped."""
    runner.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if runner.poll():
                break
            if sum(read_output(processor, "seen").values()) >= rows_seen:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"no {rows_seen} rows committed within 120 s")
    finally:
        runner.stop()
    return sum(read_output(processor, "seen").values())


def test_restarting_with_other_mapper_counts_moves_partitions_without_loss_or_repeats(
    tmp_path: Path,
) -> None:
    data = write_keyed_input(tmp_path / "in", 48_000, partitions=PARTITIONS, file_rows=1_000)
    expected = Counter(pc.cast(input_table(data)["key"], "int64").to_pylist())
    base = keyed_processor(
        data,
        tmp_path / "state.db",
        mapper=SlowPassThroughMapper,
        reducer=RowsReducer,
        config={"map_seconds": 0.2},
        name="partitions",
    )
    base = dataclasses.replace(base, tuning=dataclasses.replace(base.tuning, batch_rows=250))
    two = dataclasses.replace(base, num_mappers=2)
    assert [two.partitions_of(m) for m in range(2)] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    first = _run_until(LocalRunner(two), two, 8_000)
    assert 0 < first < 48_000

    three = dataclasses.replace(base, num_mappers=3)
    runner = LocalRunner(three)
    with RandomKiller(runner, seed=19, max_kills=6) as killer:
        second = _run_until(runner, three, first + 16_000)
    print(f"2 mappers: {first} rows; 3 mappers: {second} rows, killed {killer.kills}")
    assert first < second < 48_000

    one = dataclasses.replace(base, num_mappers=1)
    runner = LocalRunner(one)
    with RandomKiller(runner, seed=23, max_kills=4) as killer:
        summary = runner.run(timeout=180)
    print(f"1 mapper: {summary}, killed {killer.kills}")
    assert summary.rows_read == 48_000
    assert read_output(one, "seen") == expected


def test_num_mappers_must_leave_every_mapper_a_partition(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 400, partitions=3)
    processor = keyed_processor(data, tmp_path / "state.db")
    assert processor.num_mappers == processor.num_partitions == 3
    assert dataclasses.replace(processor, num_mappers=2).partitions_of(1) == (1,)
    for bad in (4, -1, 1.5):
        with pytest.raises(ConfigurationError, match="num_mappers must be an int between 1"):
            dataclasses.replace(processor, num_mappers=bad)
