"""bench.latency_floor runs the producer into the queue and commits every row once."""

from __future__ import annotations

import pytest

from bench.latency_floor import run


@pytest.mark.parametrize("commit_interval", [0.0, 0.02], ids=["every read", "a cadence"])
def test_a_short_run_is_exact_and_measures_every_steady_row(commit_interval: float) -> None:
    result = run(2_000, 2.0, warmup=0.5, keys=1_000, commit_interval=commit_interval)
    assert result["exact"], result
    assert result["rows_committed"] == result["rows_appended"] > 0
    latency = result["latency"]
    assert 0 < latency["rows"] < result["rows_appended"]  # the warm-up is left out
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
