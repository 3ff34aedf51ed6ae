"""The commit cadence: cheap commits keep the interval, expensive ones stretch it."""

from __future__ import annotations

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
