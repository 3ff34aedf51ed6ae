"""The README's first command, as a user types it, on a small input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from millstream.ledger import OUTPUT
from millstream.state import decode_int64, open_store

ROOT = Path(__file__).resolve().parent.parent.parent


def test_keyed_sum_example_from_the_command_line(tmp_path: Path) -> None:
    rows = 60_000
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MILLSTREAM_EXAMPLE_DIR": str(tmp_path),
        "MILLSTREAM_EXAMPLE_ROWS": str(rows),
    }
    command = [sys.executable, "-m", "millstream", "run", "examples.keyed_sum:processor"]
    run = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr
    assert f"drained: {rows:,} rows read" in run.stdout
    assert "running keyed_sum: 2 mappers over 2 partitions, 2 reducers" in run.stderr

    data = tmp_path / f"input-{rows}-2"
    table = pq.ParquetDataset(sorted(str(p) for p in data.glob("*/*.parquet"))).read()
    sums = table.group_by("key").aggregate([("value", "sum")])
    expected = dict(zip(sums["key"].to_pylist(), sums["value_sum"].to_pylist(), strict=True))
    store = open_store(f"sqlite:///{tmp_path / f'state-{rows}.db'}", prefix=("keyed_sum",))
    try:
        txn = store.create_transaction()
        got = {k[-1]: decode_int64(v) for k, v in txn.get_range_startswith((*OUTPUT, "sum"))}
        txn.reset()
    finally:
        store.close()
    assert got == expected

    again = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert again.returncode == 0, again.stderr
    assert f"drained: {rows:,} rows read" in again.stdout  # a rerun adds nothing
    store = open_store(f"sqlite:///{tmp_path / f'state-{rows}.db'}", prefix=("keyed_sum",))
    try:
        txn = store.create_transaction()
        rerun = {k[-1]: decode_int64(v) for k, v in txn.get_range_startswith((*OUTPUT, "sum"))}
        txn.reset()
    finally:
        store.close()
    assert rerun == expected


def test_pipeline_example_finds_the_top_words_of_each_minute(tmp_path: Path) -> None:
    rows = 40_000
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MILLSTREAM_EXAMPLE_DIR": str(tmp_path),
        "MILLSTREAM_EXAMPLE_ROWS": str(rows),
    }
    run = subprocess.run(
        [sys.executable, "-m", "examples.pipeline"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("drained:") == 2, run.stdout
    from examples import pipeline

    got = pipeline.read_top(pipeline.make_pipeline(tmp_path, rows)[1])
    assert got == pipeline.expected_top(tmp_path, rows)
