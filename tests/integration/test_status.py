"""``millstream status --json`` on a running processor: per-partition lag against the
input's true size, falling to 0 once the input is drained; where the reducers' time goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.readme import JOB, ROOT, write_data

ROWS = 8_000
PER_PARTITION = ROWS // 2


def _status(store: str) -> dict[str, Any] | None:
    result = subprocess.run(
        [sys.executable, "-m", "millstream", "status", store, "--json"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode == 1 and "no processor" in result.stdout:
        return None
    assert result.returncode == 0, result.stderr
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def test_status_json_lag_is_the_rows_left_in_each_partition(tmp_path: Path) -> None:
    write_data(tmp_path, rows=ROWS)
    (tmp_path / "job.py").write_text(JOB)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    env = {**os.environ, "JOB_STORE": store, "JOB_MAP_SLEEP": "0.1"}
    run = subprocess.Popen(
        [sys.executable, "job.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen_lag: list[int] = []
    seen_shares: list[dict[str, float]] = []
    try:
        while run.poll() is None:
            status = _status(store) if (tmp_path / "state.db").exists() else None
            for mapper in status["mappers"] if status else []:
                if mapper["lag_rows"] is None:
                    continue  # not yet published
                assert mapper["partition_end_row_index"] == PER_PARTITION
                assert mapper["lag_rows"] == PER_PARTITION - mapper["rows_persisted"]
                seen_lag.append(mapper["lag_rows"])
            if status:
                seen_shares.extend(reducer["time_shares"] for reducer in status["reducers"])
            time.sleep(0.2)
        out, err = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert f"drained: {ROWS:,} rows read" in out
    assert any(lag > 0 for lag in seen_lag), "the status never showed a mapper behind"
    # Mappers that sleep in map: their reducers spend their time waiting for answers.
    assert any(shares["mapper_wait"] > 0.1 for shares in seen_shares), seen_shares
    for shares in seen_shares:
        assert set(shares) == {"store", "reduce", "mapper_wait"}
        assert all(share >= 0 for share in shares.values()), shares
        assert sum(shares.values()) <= 1.05, shares  # shares of one thread's time

    status = _status(store)
    assert status is not None
    for mapper in status["mappers"]:
        assert mapper["partition_end_row_index"] == PER_PARTITION
        assert mapper["rows_persisted"] == PER_PARTITION
        assert mapper["lag_rows"] == 0
        assert mapper["lag_seconds"] == 0.0
    for reducer in status["reducers"]:
        assert reducer["commits"] > 0
        assert reducer["seconds_since_commit"] is not None
