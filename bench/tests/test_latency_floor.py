"""bench.latency_floor runs the producer into the queue and commits every row once."""

from __future__ import annotations

from bench.latency_floor import run


def test_a_short_run_is_exact_and_measures_every_steady_row() -> None:
    result = run(2_000, 2.0, warmup=0.5, keys=1_000)
    assert result["exact"], result
    assert result["rows_committed"] == result["rows_appended"] > 0
    latency = result["latency"]
    assert 0 < latency["rows"] < result["rows_appended"]  # the warm-up is left out
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
