"""TimeSpent: a worker loop's time per activity, as the heartbeat thread reads it."""

from __future__ import annotations

import pytest
from millstream.workers import ManualClock
from millstream.workers.status_report import TimeSpent


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def spent(clock: ManualClock) -> TimeSpent:
    return TimeSpent("store", "reduce", clock=clock.now)


def test_an_inner_span_counts_for_its_own_activity_only(
    clock: ManualClock, spent: TimeSpent
) -> None:
    with spent.spent_on("store"):
        clock.advance(1.0)
        with spent.spent_on("reduce"):
            clock.advance(4.0)
        clock.advance(2.0)
    assert spent.figures() == {"seconds_store": 3.0, "seconds_reduce": 4.0}


def test_the_span_under_way_shows_while_it_runs_and_figures_never_go_back(
    clock: ManualClock, spent: TimeSpent
) -> None:
    with spent.spent_on("store"):
        clock.advance(1.0)
        with spent.spent_on("reduce"):
            clock.advance(2.0)
            assert spent.figures() == {"seconds_store": 1.0, "seconds_reduce": 2.0}
            clock.advance(2.0)
            assert spent.figures() == {"seconds_store": 1.0, "seconds_reduce": 4.0}
        # As if the heartbeat had read in the middle of the span's end: the span missed.
        spent.seconds["reduce"] = 0.0
        assert spent.figures()["seconds_reduce"] == 4.0
        clock.advance(0.5)
        assert spent.figures() == {"seconds_store": 1.5, "seconds_reduce": 4.0}
