"""Pure helpers for latency figures: weighted percentiles, summaries, trends, gaps.

A latency sample is a group of rows that share one latency (the rows of one producer
append committed by one reducer transaction), so every statistic here is weighted by a row
count: the p99 is the latency that 99 % of *rows* do not exceed, whatever the grouping.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

QUANTILES = (0.5, 0.9, 0.99, 0.999)
"""The percentiles every latency table reports (plus the maximum)."""


def weighted_quantiles(
    values: np.ndarray | Sequence[float],
    weights: np.ndarray | Sequence[float],
    quantiles: Sequence[float] = QUANTILES,
) -> list[float]:
    """The lower weighted quantiles: for each q, the smallest v such that rows with a value
    at most v weigh at least ``q`` of the total.

    With unit weights this is the "inverted CDF" quantile (``numpy.quantile(...,
    method="inverted_cdf")``): no interpolation, every answer is an observed value.

    Raises:
        ValueError: No positive weight, a negative weight, or a quantile outside [0, 1].
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if v.shape != w.shape:
        raise ValueError(f"{v.shape[0]} values but {w.shape[0]} weights")
    if (w < 0).any():
        raise ValueError("weights must be >= 0")
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        raise ValueError("no samples with a positive weight")
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    total = cum[-1]
    out = []
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} outside [0, 1]")
        # Relative tolerance: cumulative float sums of integer row counts are exact here,
        # but q * total is not (0.999 * 1000 = 998.9999999999999).
        i = int(np.searchsorted(cum, q * total * (1 - 1e-12), side="left"))
        out.append(float(v[min(i, v.size - 1)]))
    return out


def summarize_latency(
    latency_seconds: np.ndarray | Sequence[float], rows: np.ndarray | Sequence[float]
) -> dict[str, float]:
    """Rows, mean, p50, p90, p99, p99.9 and max (seconds) of weighted latency samples.

    Returns ``{"rows": 0}`` when there is no sample.
    """
    lat = np.asarray(latency_seconds, dtype=np.float64)
    w = np.asarray(rows, dtype=np.float64)
    total = float(w.sum()) if w.size else 0.0
    if total <= 0:
        return {"rows": 0}
    p50, p90, p99, p999 = weighted_quantiles(lat, w, QUANTILES)
    return {
        "rows": int(total),
        "mean": float((lat * w).sum() / total),
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "p99.9": p999,
        "max": float(lat[w > 0].max()),
        "min": float(lat[w > 0].min()),
    }


def median_ratios(
    pairs: Sequence[tuple[dict[str, float], dict[str, float]]],
) -> dict[str, float]:
    """For each quantile of :func:`summarize_latency`, the median over ``pairs`` of
    ``measured / floor``: latencies quoted against a floor measured beside them (in the same
    invocation), so that runs on a loaded or a quiet machine compare.

    Raises:
        ValueError: No pair, or a floor of zero.
    """
    if not pairs:
        raise ValueError("no (measured, floor) pair")
    out = {}
    for q in ("p50", "p90", "p99", "p99.9", "max"):
        ratios = []
        for measured, floor in pairs:
            if floor[q] <= 0:
                raise ValueError(f"the floor's {q} is {floor[q]}: not a latency")
            ratios.append(measured[q] / floor[q])
        out[q] = float(np.median(ratios))
    return out


def weighted_slope(
    x: np.ndarray | Sequence[float],
    y: np.ndarray | Sequence[float],
    w: np.ndarray | Sequence[float],
) -> float:
    """Slope of the weighted least-squares line through ``(x, y)``; 0 when x does not vary.

    Used on (append time, latency): a pipeline that keeps up has a flat latency (slope ~0);
    one offered more than it can take falls behind at ``offered / capacity - 1`` seconds
    of latency per second.
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    wa = np.asarray(w, dtype=np.float64)
    total = wa.sum()
    if xa.size < 2 or total <= 0:
        return 0.0
    mx = (wa * xa).sum() / total
    my = (wa * ya).sum() / total
    var = (wa * (xa - mx) ** 2).sum()
    if var <= 0:
        return 0.0
    return float((wa * (xa - mx) * (ya - my)).sum() / var)


def gaps(times: np.ndarray | Sequence[float]) -> np.ndarray:
    """Differences between consecutive distinct sorted times (e.g. one reducer's commits)."""
    t = np.unique(np.asarray(times, dtype=np.float64))
    return np.diff(t)


def gap_summary(times: np.ndarray | Sequence[float]) -> dict[str, float]:
    """Count, median, p99 and max of :func:`gaps` (seconds); ``{"gaps": 0}`` if fewer than 2."""
    g = gaps(times)
    if g.size == 0:
        return {"gaps": 0}
    p50, p99 = weighted_quantiles(g, np.ones_like(g), (0.5, 0.99))
    return {"gaps": int(g.size), "median": p50, "p99": p99, "max": float(g.max())}


def first_time_at_or_below(
    times: np.ndarray | Sequence[float],
    values: np.ndarray | Sequence[float],
    level: float,
    *,
    after: float,
    hold: float = 0.0,
) -> float | None:
    """The first time ``>= after`` from which ``values`` stay at or below ``level`` for at
    least ``hold`` seconds (until the last sample if it is sooner); ``None`` if never.

    Used for "the lag returned to its steady-state level": a single low sample in a
    still-draining backlog does not count when ``hold`` is a few sampling periods.
    """
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    candidate: float | None = None
    for ti, vi in zip(t, v, strict=True):
        if ti < after:
            continue
        if vi <= level:
            if candidate is None:
                candidate = float(ti)
            if ti - candidate >= hold:
                return candidate
        else:
            candidate = None
    return candidate


def fmt_ms(seconds: Any) -> str:
    """Milliseconds with a precision that suits the magnitude, or ``n/a``."""
    if seconds is None or (isinstance(seconds, float) and np.isnan(seconds)):
        return "n/a"
    ms = float(seconds) * 1000
    if ms >= 1000:
        return f"{ms:,.0f}"
    if ms >= 10:
        return f"{ms:.0f}"
    return f"{ms:.1f}"


def timeline(
    times: np.ndarray | Sequence[float],
    latency: np.ndarray | Sequence[float],
    rows: np.ndarray | Sequence[float],
    *,
    start: float,
    bin_seconds: float = 1.0,
) -> list[dict[str, float]]:
    """Per bin of ``times`` (from ``start``): rows, p50, p99 and max latency.

    Bins without rows are left out.
    """
    t = np.asarray(times, dtype=np.float64)
    lat = np.asarray(latency, dtype=np.float64)
    w = np.asarray(rows, dtype=np.float64)
    if t.size == 0:
        return []
    bins = np.floor((t - start) / bin_seconds).astype(np.int64)
    out = []
    for b in np.unique(bins):
        mask = (bins == b) & (w > 0)
        if not mask.any():
            continue
        p50, p99 = weighted_quantiles(lat[mask], w[mask], (0.5, 0.99))
        out.append(
            {
                "t": float(b * bin_seconds),
                "rows": int(w[mask].sum()),
                "p50": p50,
                "p99": p99,
                "max": float(lat[mask].max()),
            }
        )
    return out


def save_append_times(
    out: Path,
    appends: list[np.ndarray],
    rows: list[np.ndarray],
    commits: list[np.ndarray],
    plan_seconds: Sequence[float] = (),
) -> None:
    """Write a floor process's (append ns, rows, commit ns) per append, and its batch
    records' seconds, to ``out`` (``.npz``), as :func:`bench.latency_floor.run` reads them."""
    empty = [np.zeros(0, np.int64)]
    np.savez(
        out,
        append_ns=np.concatenate(appends or empty),
        rows=np.concatenate(rows or empty),
        commit_ns=np.concatenate(commits or empty),
        plan_seconds=np.array(plan_seconds, np.float64),
    )
