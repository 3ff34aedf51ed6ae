"""The single-process floor computes the counters job exactly and writes them durably."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench import floor
from bench.floor_ratio import measure_floor
from bench.workload import WorkloadSpec, generate

SPEC = WorkloadSpec(rows=12_001, partitions=2, keys=700, rows_per_file=2_500, seed=11)


@pytest.mark.parametrize("use_threads", [True, False])
def test_a_run_matches_a_plain_python_count_key_by_key(tmp_path: Path, use_threads: bool) -> None:
    workload = generate(SPEC, tmp_path / "data")
    total: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    for f in workload.files():
        for row in pq.read_table(f, columns=["key", "value"]).to_pylist():
            total[row["key"]] += row["value"]
            count[row["key"]] += 1
    summary = floor.run(workload.path, tmp_path, 2, use_threads=use_threads)
    assert summary["rows"] == SPEC.rows
    assert summary["keys"] == len(total)
    got = floor.read(tmp_path / floor.DATABASE, 2).to_pylist()
    assert got == [{"key": k, "total": total[k], "count": count[k]} for k in sorted(total)]


def test_every_counter_round_trips_through_the_database(tmp_path: Path) -> None:
    result = pa.table(
        {
            "key": pa.array([-5, 0, 2**62], pa.int64()),
            "total": pa.array([-(2**63), 0, 2**63 - 1], pa.int64()),
            "count": pa.array([1, 2, 3], pa.int64()),
            "squares": pa.array([0, 4, 9], pa.int64()),
            "odd": pa.array([1, 0, 1], pa.int64()),
        }
    )
    floor.write(tmp_path / "out.db", result)
    assert floor.read(tmp_path / "out.db", 4).equals(result)


def test_an_empty_result_reads_back_empty(tmp_path: Path) -> None:
    empty = pa.table({"key": pa.array([], pa.int64()), "total": pa.array([], pa.int64())})
    floor.write(tmp_path / "out.db", empty)
    assert floor.read(tmp_path / "out.db", 1).equals(empty)


def test_an_earlier_runs_database_is_never_written_into(tmp_path: Path) -> None:
    result = pa.table({"key": pa.array([1], pa.int64()), "total": pa.array([7], pa.int64())})
    floor.write(tmp_path / "out.db", result)
    with pytest.raises(FileExistsError, match="fresh run directory"):
        floor.write(tmp_path / "out.db", result.set_column(1, "total", pa.array([8])))
    assert floor.read(tmp_path / "out.db", 1).equals(result)


def test_a_directory_without_partitions_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"bench\.workload"):
        floor.run(tmp_path, tmp_path, 2)
    assert not (tmp_path / floor.DATABASE).exists()


def test_the_measured_child_is_verified_against_the_expected_result(tmp_path: Path) -> None:
    workload = generate(SPEC, tmp_path / "data")
    result = measure_floor(workload, 2, tmp_path / "run", log=lambda _: None)
    assert result.verified["ok"], result.verified
    assert result.rows == SPEC.rows
    assert result.batches[0].rows == SPEC.rows
    assert result.written["store_files"] > 0
