"""Weighted percentiles, trends and recovery detection of the latency benchmarks."""

from __future__ import annotations

import numpy as np
import pytest

from bench.latency_stats import (
    first_time_at_or_below,
    gap_summary,
    gaps,
    median_ratios,
    summarize_latency,
    timeline,
    weighted_quantiles,
    weighted_slope,
)


def test_unit_weights_match_numpy_inverted_cdf() -> None:
    rng = np.random.default_rng(0)
    values = rng.exponential(size=1001)
    qs = [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0]
    expected = np.quantile(values, qs, method="inverted_cdf")
    assert weighted_quantiles(values, np.ones_like(values), qs) == pytest.approx(expected)


def test_weights_count_rows() -> None:
    # 99 rows at 10 ms, 1 row at 1 s: the p99 is 10 ms, the p99.9 and max 1 s.
    p50, p99, p999 = weighted_quantiles([0.01, 1.0], [99, 1], (0.5, 0.99, 0.999))
    assert (p50, p99, p999) == (0.01, 0.01, 1.0)
    # Weighting is the same as repeating the sample.
    repeated = np.repeat([0.3, 0.1, 0.2], [5, 2, 13])
    assert weighted_quantiles([0.3, 0.1, 0.2], [5, 2, 13], (0.1, 0.5, 0.9)) == pytest.approx(
        np.quantile(repeated, [0.1, 0.5, 0.9], method="inverted_cdf")
    )


def test_exact_boundaries_are_not_lost_to_rounding() -> None:
    # 999 rows at 1, 1 row at 2: p99.9 is exactly the 999th row, so 1.
    assert weighted_quantiles([1.0, 2.0], [999, 1], (0.999,)) == [1.0]


def test_zero_weights_are_ignored_and_bad_input_rejected() -> None:
    assert weighted_quantiles([5.0, 1.0], [0, 3], (1.0,)) == [1.0]
    with pytest.raises(ValueError, match="no samples"):
        weighted_quantiles([1.0], [0], (0.5,))
    with pytest.raises(ValueError, match=">= 0"):
        weighted_quantiles([1.0], [-1], (0.5,))
    with pytest.raises(ValueError, match="outside"):
        weighted_quantiles([1.0], [1], (1.5,))


def test_summary() -> None:
    s = summarize_latency([0.1, 0.2, 0.4], [1, 2, 1])
    assert s["rows"] == 4
    assert s["mean"] == pytest.approx(0.225)
    assert (s["p50"], s["max"], s["min"]) == (0.2, 0.4, 0.1)
    assert summarize_latency([], []) == {"rows": 0}


def test_slope_is_flat_when_keeping_up_and_positive_when_falling_behind() -> None:
    t = np.arange(100.0)
    assert weighted_slope(t, np.full(100, 0.05), np.ones(100)) == pytest.approx(0.0)
    assert weighted_slope(t, 0.05 + 0.2 * t, np.ones(100)) == pytest.approx(0.2)
    assert weighted_slope([1.0, 1.0], [0.0, 5.0], [1, 1]) == 0.0


def test_gaps() -> None:
    assert list(gaps([3.0, 1.0, 1.0, 2.5])) == [1.5, 0.5]
    s = gap_summary([0.0, 0.1, 0.2, 5.2])
    assert s["gaps"] == 3
    assert s["max"] == pytest.approx(5.0)
    assert gap_summary([1.0]) == {"gaps": 0}


def test_recovery_needs_the_level_to_hold() -> None:
    t = np.arange(0.0, 10.0, 0.5)
    lag = np.array([5, 5, 50, 80, 60, 4, 70, 40, 20, 5, 4, 3, 5, 5, 5, 5, 5, 5, 5, 5], float)
    # The dip to 4 at t=2.5 does not hold for a second; from t=4.5 it does.
    assert first_time_at_or_below(t, lag, 5, after=1.0, hold=1.0) == 4.5
    assert first_time_at_or_below(t, lag, 5, after=1.0, hold=0.0) == 2.5
    assert first_time_at_or_below(t, lag, 1, after=0.0, hold=1.0) is None
    # Still below the level at the last sample, held for less than ``hold``: reported.
    assert first_time_at_or_below([0.0, 1.0], [9, 1], 5, after=0.0, hold=5.0) == 1.0


def test_timeline_bins() -> None:
    rows = timeline([0.1, 0.9, 1.5, 3.2], [0.01, 0.03, 0.5, 0.2], [1, 1, 2, 0], start=0.0)
    assert [r["t"] for r in rows] == [0.0, 1.0]
    assert rows[0]["rows"] == 2
    assert rows[0]["max"] == 0.03
    assert rows[1]["p99"] == 0.5


def test_median_ratios_take_each_pair_against_its_own_floor() -> None:
    floor = {"p50": 0.005, "p90": 0.01, "p99": 0.01, "p99.9": 0.02, "max": 0.04}
    slow_floor = {q: 2 * v for q, v in floor.items()}
    pairs = [
        ({q: 3 * v for q, v in floor.items()}, floor),
        ({q: 2 * v for q, v in slow_floor.items()}, slow_floor),  # a loaded run: same 2x
        ({q: 5 * v for q, v in floor.items()}, floor),
    ]
    ratios = median_ratios(pairs)
    assert ratios == pytest.approx({"p50": 3.0, "p90": 3.0, "p99": 3.0, "p99.9": 3.0, "max": 3.0})


def test_median_ratios_refuse_no_pair_and_a_zero_floor() -> None:
    with pytest.raises(ValueError, match="no"):
        median_ratios([])
    zero = {"p50": 0.0, "p90": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0}
    with pytest.raises(ValueError, match="p50"):
        median_ratios([(zero, zero)])
