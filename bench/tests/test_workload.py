"""The workload is deterministic, reused when present, and its expected results are right."""

from __future__ import annotations

import heapq
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from bench.workload import ROW_BYTES, WorkloadSpec, generate

SPEC = WorkloadSpec(rows=10_001, partitions=2, keys=3_000, rows_per_file=2_000, seed=7)


def test_layout_and_determinism(tmp_path: Path) -> None:
    a = generate(SPEC, tmp_path / "a")
    b = generate(SPEC, tmp_path / "b")
    assert [f.name for f in a.files()] == [f.name for f in b.files()]
    assert len(a.files()) == 6  # 5,001 + 5,000 rows in files of 2,000
    for fa, fb in zip(a.files(), b.files(), strict=True):
        assert pq.read_table(fa).equals(pq.read_table(fb))
    assert sum(pq.read_metadata(f).num_rows for f in a.files()) == SPEC.rows
    assert a.input_bytes == SPEC.rows * ROW_BYTES
    assert {len(p) for p in pq.read_table(a.files()[0])["payload"].to_pylist()} == {64}


def test_reused_when_present(tmp_path: Path) -> None:
    first = generate(SPEC, tmp_path)
    mtime = first.files()[0].stat().st_mtime_ns
    again = generate(SPEC, tmp_path)
    assert again.files()[0].stat().st_mtime_ns == mtime


def test_expected_results_match_a_plain_python_computation(tmp_path: Path) -> None:
    workload = generate(SPEC, tmp_path)
    sums: dict[int, int] = defaultdict(int)
    payloads: dict[int, list[str]] = defaultdict(list)
    for f in workload.files():
        for row in pq.read_table(f).to_pylist():
            sums[row["key"]] += row["value"]
            payloads[row["key"]].append(row["payload"])
    assert workload.expected_sum().to_pylist() == [
        {"key": k, "total": sums[k]} for k in sorted(sums)
    ]
    expected = []
    for k in sorted(payloads):
        best = [*heapq.nsmallest(3, payloads[k]), None, None, None][:3]
        expected.append(
            {"key": k, "count": len(payloads[k]), "s0": best[0], "s1": best[1], "s2": best[2]}
        )
    assert workload.expected_smallest().to_pylist() == expected
