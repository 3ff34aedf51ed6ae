"""At-least-once delivery end to end: nothing lost under kill -9 and duplicate workers.

Every input row carries its own value, the map combines each batch into one row per key
(so shuffled rows depend on where batches are cut: the case batch-boundary records exist
for), and the reducer counts every value it receives. Nothing is lost when every value is
counted at least once; repeats are reported, not asserted away.
"""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pytest
from millstream.exceptions import ConfigurationError
from millstream.runner.local import LocalRunner

from tests.support.chaos import run_killed
from tests.support.jobs import (
    SeenValuesReducer,
    ValuesByKeyMapper,
    input_table,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)
from tests.support.stores import ON_BOTH, ON_FDB


def _processor(
    tmp_path: Path, rows: int, tune: ms.Tuning, state_url: str | None = None
) -> tuple[ms.Processor, list[int]]:
    data = write_keyed_input(tmp_path / "in", rows, partitions=2, unique_values=True)
    processor = keyed_processor(
        data,
        state_url or tmp_path / "state.db",
        mapper=ValuesByKeyMapper,
        reducer=SeenValuesReducer,
        tune=tune,
        delivery="at_least_once",
    )
    return processor, input_table(data)["value"].to_pylist()


def _repeats(processor: ms.Processor, values: list[int]) -> int:
    """Asserts that every value was counted at least once; returns the extra counts."""
    seen = read_output(processor, "seen")
    lost = set(values) - set(seen)
    assert not lost, f"{len(lost)} rows lost, e.g. {sorted(lost)[:10]}"
    assert set(seen) == set(values), "values that no input row holds were counted"
    assert min(seen.values()) >= 1
    return sum(seen.values()) - len(values)


def test_without_failures_every_row_is_applied_once(tmp_path: Path) -> None:
    processor, values = _processor(tmp_path, 60_000, tuning(batch_rows=2_000))
    summary = LocalRunner(processor).run(timeout=120)
    assert summary.rows_read == 60_000
    assert _repeats(processor, values) == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "state_url"),
    [
        (7, "sqlite"),
        (8, "sqlite"),
        (9, "sqlite"),
        pytest.param(10, *ON_FDB.values, marks=ON_FDB.marks),
    ],
    indirect=["state_url"],
)
def test_kill_9_loses_nothing(tmp_path: Path, seed: int, state_url: str) -> None:
    tune = tuning(
        batch_rows=2_000,
        memory_limit_bytes=40_000,
        commit_interval_seconds=0.1,
        restart=ms.RestartStrategy(max_restarts=1_000),
    )
    processor, values = _processor(tmp_path, 200_000, tune, state_url)
    summary, kills = run_killed(processor, seed)
    assert summary.restarts > 0
    repeats = _repeats(processor, values)
    print(f"seed {seed}: killed {kills}; {repeats} of {len(values)} rows applied again")


@pytest.mark.parametrize("state_url", ON_BOTH, indirect=True)
def test_a_duplicate_mapper_loses_nothing(tmp_path: Path, state_url: str) -> None:
    processor, values = _processor(
        tmp_path, 60_000, tuning(batch_rows=2_000, memory_limit_bytes=400_000), state_url
    )
    LocalRunner(processor, instances={("mapper", 0): 2}).run(timeout=180)
    repeats = _repeats(processor, values)
    print(f"a duplicate mapper: {repeats} of {len(values)} rows applied again")


def test_a_processor_keeps_its_delivery_mode(tmp_path: Path) -> None:
    processor, _ = _processor(tmp_path, 6_000, tuning())
    LocalRunner(processor).run(timeout=60)
    again = keyed_processor(
        tmp_path / "in",
        tmp_path / "state.db",
        mapper=ValuesByKeyMapper,
        reducer=SeenValuesReducer,
    )
    with pytest.raises(ConfigurationError, match="delivery 'at_least_once'"):
        LocalRunner(again).run(timeout=60)
