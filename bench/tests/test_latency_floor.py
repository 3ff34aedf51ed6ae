"""bench.latency_floor runs the producer into the queue and commits every row once."""

from __future__ import annotations

import pytest

from bench.latency_floor import run


@pytest.mark.parametrize(
    ("commit_interval", "delivery", "committers", "rounds"),
    [
        (0.0, "at_least_once", 0, False),
        (0.02, "at_least_once", 0, False),
        (0.02, "exactly_once", 0, False),
        (0.0, "at_least_once", 1, False),
        (0.0, "at_least_once", 2, False),
        (0.0, "at_least_once", 2, True),
    ],
    ids=[
        "every read",
        "a cadence",
        "a cadence, exactly once",
        "one committer",
        "two committers",
        "two committers in rounds",
    ],
)
def test_a_short_run_is_exact_and_measures_every_steady_row(
    commit_interval: float, delivery: str, committers: int, rounds: bool
) -> None:
    result = run(
        2_000,
        2.0,
        warmup=0.5,
        keys=1_000,
        commit_interval=commit_interval,
        delivery=delivery,
        committers=committers,
        rounds=rounds,
    )
    assert result["exact"], result
    assert result["rows_committed"] == result["rows_appended"] > 0
    latency = result["latency"]
    assert 0 < latency["rows"] < result["rows_appended"]  # the warm-up is left out
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    if rounds:
        # Each committer commits both readers' calls together: about one commit per two
        # appends each, where committing each call alone makes one per append each.
        assert result["commits"] <= 1.5 * result["appends"], result
    if delivery == "exactly_once":
        assert result["batches_planned"] > 0  # every read with rows recorded its batch
        assert 0 < result["plan_ms"]["p50"] <= result["plan_ms"]["p99"]
    else:
        assert result["batches_planned"] == 0
