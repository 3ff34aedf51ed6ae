"""The commit cadence: cheap commits keep the interval, expensive ones stretch it."""

from __future__ import annotations

from typing import Any

import millstream as ms
import pyarrow as pa
import pytest
from millstream.workers.reducer_worker.cadence import CommitCadence


def test_cheap_commits_keep_the_commit_interval() -> None:
    cadence = CommitCadence(ms.Tuning(commit_interval_seconds=0.2))
    assert cadence.interval == 0.2
    cadence.observe(0.01)
    assert cadence.interval == 0.2


def test_expensive_commits_keep_the_share_of_time_in_transactions() -> None:
    cadence = CommitCadence(ms.Tuning(commit_interval_seconds=0.2, commit_time_share=0.25))
    cadence.observe(0.2)  # a 0.2 s transaction every 0.8 s: a quarter of the time
    assert cadence.interval == pytest.approx(0.8)
    cadence.observe(10.0)  # capped at five times the interval by default
    assert cadence.interval == pytest.approx(1.0)


def test_the_longest_interval_is_a_setting() -> None:
    tuning = ms.Tuning(commit_interval_seconds=0.1, commit_max_interval_seconds=3.0)
    cadence = CommitCadence(tuning)
    cadence.observe(5.0)
    assert cadence.interval == 3.0


def test_bad_cadence_settings_are_refused() -> None:
    with pytest.raises(ms.exceptions.ConfigurationError, match="commit_time_share"):
        _validate(ms.Tuning(commit_time_share=0.0))
    with pytest.raises(ms.exceptions.ConfigurationError, match="commit_max_interval_seconds"):
        _validate(ms.Tuning(commit_interval_seconds=1.0, commit_max_interval_seconds=0.5))


def _validate(tuning: ms.Tuning) -> None:
    """Processor validation, where settings are checked."""
    from millstream.testing import MemoryInput

    ms.Processor(
        mapper=ms.Mapper,
        reducer=ms.Reducer,
        input=MemoryInput([pa.table({"key": pa.array([], pa.int64())})]),
        store="sqlite:///tmp/unused.db",
        num_reducers=1,
        tuning=tuning,
    )


def test_a_round_that_waited_for_rows_counts_the_next_interval_from_their_answer() -> None:
    cadence = CommitCadence(ms.Tuning(commit_interval_seconds=0.01))
    # The first answer came 4 ms into the round: the rows arrived then, and the next round
    # starts an interval after them, when the next rows of a stream of one append per
    # interval arrive.
    assert cadence.counted_from(100.0, 100.004) == pytest.approx(100.004)


def test_a_round_whose_rows_were_waiting_steps_back_a_tenth_of_an_interval() -> None:
    cadence = CommitCadence(ms.Tuning(commit_interval_seconds=0.01))
    # Answered at once (or before the round began): the rows waited for the round. The next
    # round starts a tenth of an interval sooner, until the rounds wait for the rows again.
    assert cadence.counted_from(100.0, 100.0005) == pytest.approx(99.999)
    assert cadence.counted_from(100.0, 99.98) == pytest.approx(99.999)


def test_a_round_without_a_timed_answer_counts_from_its_start() -> None:
    cadence = CommitCadence(ms.Tuning(commit_interval_seconds=0.2))
    assert cadence.counted_from(100.0, None) == 100.0


def test_rounds_fall_into_step_with_rows_that_arrive_once_an_interval() -> None:
    """Rows reach the mappers every 10 ms, and each round starts a little late (its sleep
    ends 0.3 ms after its time) and takes 4 ms. Counted from their starts alone, the
    rounds drift later against the arrivals and the rows' wait for a round grows to most
    of an interval; counted as :meth:`CommitCadence.counted_from` says, the waits stay
    under the step."""

    def waits(count: Any) -> list[float]:
        cadence = CommitCadence(ms.Tuning(commit_interval_seconds=0.01))
        arrival, last_start, result = 0.0007, -0.01, []
        for _ in range(200):
            start = last_start + cadence.interval + 0.0003  # the sleep ends late
            answered = max(start, arrival)  # a held call answers when the rows arrive
            result.append(answered - arrival)
            last_start = count(cadence, start, answered)
            arrival += 0.01
        return result[100:]

    drifting = waits(lambda _c, start, _answered: start)
    in_step = waits(lambda c, start, answered: c.counted_from(start, answered))
    assert max(drifting) > 0.005
    assert max(in_step) <= 0.001
