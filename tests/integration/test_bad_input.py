"""Bad input and misconfiguration: a clear error, the run stops, a fixed rerun is exact."""

from __future__ import annotations

import shutil
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from millstream.exceptions import (
    ConfigurationError,
    InputError,
    StoreUnavailableError,
    UserCodeError,
)
from millstream.runner.local import LocalRunner

from tests.support.jobs import (
    KeyedSumMapper,
    KeyedSumReducer,
    PassThroughMapper,
    RowsReducer,
    expected_sums,
    keyed_processor,
    read_output,
    write_keyed_input,
)

ROWS = 40_000


def _fails(processor: ms.Processor, error: type[Exception]) -> str:
    runner = LocalRunner(processor)
    with pytest.raises(error) as caught:
        runner.run(timeout=120)
    assert runner.pids() == {}, "the runner must stop every worker, not restart them"
    return str(caught.value)


def _exact_after_rerun(processor: ms.Processor, data: Path) -> None:
    summary = LocalRunner(processor).run(timeout=120)
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == ROWS


def test_corrupt_parquet_file(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS)
    bad = data / "partition=1" / "part-00001.parquet"
    good = tmp_path / "good.parquet"
    shutil.copy(bad, good)
    bad.write_bytes(b"PAR1 this is not a parquet file" * 10)
    processor = keyed_processor(data, tmp_path / "state.db")
    message = _fails(processor, InputError)
    assert str(bad) in message
    assert "Replace or repair the file" in message
    shutil.copy(good, bad)
    _exact_after_rerun(processor, data)


def test_schema_change_inside_partition(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS)
    changed = data / "partition=0" / "part-00001.parquet"
    good = tmp_path / "good.parquet"
    shutil.copy(changed, good)
    table = pq.read_table(changed)
    pq.write_table(table.set_column(1, "value", table["value"].cast(pa.string())), changed)
    processor = keyed_processor(data, tmp_path / "state.db")
    message = _fails(processor, InputError)
    assert "schema change inside partition" in message
    assert str(changed) in message
    assert "column 'value' changed from int64 to string" in message
    shutil.copy(good, changed)
    _exact_after_rerun(processor, data)


def test_map_that_raises(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS, poison_row=(0, 12_345))
    state = tmp_path / "state.db"
    message = _fails(keyed_processor(data, state, config={"fail_map": True}), UserCodeError)
    assert "map of mapper 0 raised on input rows [" in message
    assert "poisoned key" in message
    assert "fix the mapper" in message
    start, end = (int(x) for x in message.split("input rows [")[1].split(")")[0].split(", "))
    assert start <= 12_345 < end
    _exact_after_rerun(keyed_processor(data, state, config={"fail_map": False}), data)


def test_reduce_that_raises(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS, poison_row=(1, 7_000))
    state = tmp_path / "state.db"
    message = _fails(keyed_processor(data, state, config={"fail_reduce": True}), UserCodeError)
    assert "reduce of reducer" in message
    assert "mapper 1 shuffle rows (" in message
    assert "poisoned key" in message
    assert "Nothing of this batch was committed" in message
    _exact_after_rerun(keyed_processor(data, state, config={"fail_reduce": False}), data)


def test_unreachable_store(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS)
    state = tmp_path / "missing" / "state.db"
    processor = keyed_processor(data, state)
    message = _fails(processor, StoreUnavailableError)
    assert str(state) in message
    assert "does not exist" in message
    state.parent.mkdir()
    _exact_after_rerun(processor, data)


def test_mismatched_counts_on_existing_store(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS)
    state = tmp_path / "state.db"
    _exact_after_rerun(keyed_processor(data, state, num_reducers=2), data)
    runner = LocalRunner(keyed_processor(data, state, num_reducers=3))
    with pytest.raises(ConfigurationError) as caught:
        runner.run(timeout=60)
    message = str(caught.value)
    assert "has 2 reducers but was started with 3" in message
    assert "millstream rescale <job>:processor --reducers 3" in message
    assert runner.pids() == {}
    # Other classes on the same store: no rescale helps.
    other = keyed_processor(data, state, num_reducers=2, reducer=RowsReducer)
    with pytest.raises(ConfigurationError, match="Restart it with the original configuration"):
        LocalRunner(other).run(timeout=60)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mysql://localhost/db", "unknown scheme"),
        ("sqlite://relative.db", "the path must be absolute"),
        ("no-scheme", "expected scheme"),
    ],
)
def test_bad_store_url(tmp_path: Path, url: str, words: str) -> None:
    data = write_keyed_input(tmp_path / "in", 2_000)
    with pytest.raises(ConfigurationError, match=words):
        ms.Processor(
            mapper=KeyedSumMapper,
            reducer=KeyedSumReducer,
            input=ms.inputs.ParquetLog(str(data)),
            store=url,
            num_reducers=1,
        )


def test_not_a_mapper_class(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 2_000)
    with pytest.raises(ConfigurationError, match=r"subclass of millstream\.Mapper"):
        ms.Processor(
            mapper=KeyedSumReducer,  # type: ignore[arg-type]
            reducer=KeyedSumReducer,
            input=ms.inputs.ParquetLog(str(data)),
            store=f"sqlite:///{tmp_path / 's.db'}",
            num_reducers=1,
        )
    with pytest.raises(ConfigurationError, match=r"subclass of millstream\.Reducer"):
        ms.Processor(
            mapper=KeyedSumMapper,
            reducer=dict,  # type: ignore[arg-type]
            input=ms.inputs.ParquetLog(str(data)),
            store=f"sqlite:///{tmp_path / 's.db'}",
            num_reducers=1,
        )


def test_missing_input_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is not a directory"):
        ms.Processor(
            mapper=KeyedSumMapper,
            reducer=KeyedSumReducer,
            input=ms.inputs.ParquetLog(str(tmp_path / "nothing")),
            store=f"sqlite:///{tmp_path / 's.db'}",
            num_reducers=1,
        )


def test_mappers_with_different_schemas(tmp_path: Path) -> None:
    """Partition 1 has float values, partition 0 int ones: the reducer gets both at once."""
    data = write_keyed_input(tmp_path / "in", ROWS)
    for f in sorted((data / "partition=1").glob("*.parquet")):
        table = pq.read_table(f)
        pq.write_table(table.set_column(1, "value", table["value"].cast(pa.float64())), f)
    processor = keyed_processor(data, tmp_path / "state.db", mapper=PassThroughMapper)
    LocalRunner(processor).run(timeout=120)
    sums = read_output(processor, "sum")
    assert sums == {k: int(v) for k, v in expected_sums(data).items()}


def test_mappers_with_incompatible_schemas(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS)
    for f in sorted((data / "partition=1").glob("*.parquet")):
        table = pq.read_table(f)
        pq.write_table(table.set_column(1, "value", table["value"].cast(pa.string())), f)
    processor = keyed_processor(data, tmp_path / "state.db", mapper=PassThroughMapper)
    message = _fails(processor, UserCodeError)
    # Either both mappers' rows meet in one fetch (the schemas cannot be unified) or
    # mapper 1's string rows arrive alone and reduce fails on them: both name mapper 1.
    assert "mapper 1" in message
    if "incompatible schemas" in message:
        assert "mapper 0" in message
    else:
        assert "reduce of reducer" in message
