"""``millstream run`` and ``millstream status`` as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from millstream.ledger import read_reducer_state

from tests.support.jobs import expected_sums, keyed_processor, read_output, write_keyed_input

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _millstream(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "millstream", *args],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_run_then_status(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 30_000)
    state = tmp_path / "state.db"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MILLSTREAM_TEST_DATA": str(data),
        "MILLSTREAM_TEST_STATE": str(state),
    }
    run = _millstream("run", "tests.support.cli_job:processor", "--timeout", "150", env=env)
    assert run.returncode == 0, run.stderr
    assert "drained: 30,000 rows read" in run.stdout
    assert "running keyed: 2 mappers over 2 partitions, 2 reducers" in run.stderr
    processor = keyed_processor(data, state)
    assert read_output(processor, "sum") == expected_sums(data)

    status = _millstream("status", f"sqlite:///{state}", "--prefix", "keyed", env=env)
    assert status.returncode == 0, status.stderr
    out = status.stdout
    assert "processor keyed: 2 input partitions, 2 reducers" in out
    assert "window rows" in out
    assert "committed row indices" in out
    store = processor.open_store()
    try:
        txn = store.create_transaction()
        committed = [read_reducer_state(txn, r, 2).committed_row_indices for r in range(2)]
        txn.reset()
    finally:
        store.close()
    for indices in committed:
        assert str(list(indices)) in out

    missing = _millstream("status", f"sqlite:///{state}", "--prefix", "other", env=env)
    assert missing.returncode == 1
    assert "no processor under prefix 'other'" in missing.stdout


def test_run_reports_bad_reference(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = _millstream("run", "tests.support.jobs:KEYS", env=env)
    assert result.returncode == 2
    assert "tests.support.jobs:KEYS is not a millstream.Processor" in result.stderr
