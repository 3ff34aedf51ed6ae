"""Names that moved so that one word keeps one meaning still work, each with a
DeprecationWarning: ``RestartStrategy(window_seconds=...)`` (a window is a mapper's
buffer of rows) and ``PendingRows.mapper_indices``/``ended_mappers`` (they hold input
partitions)."""

from __future__ import annotations

import millstream as ms
import numpy as np
import pyarrow as pa
import pytest


def test_restart_window_seconds_sets_interval_seconds() -> None:
    with pytest.warns(DeprecationWarning, match="interval_seconds"):
        strategy = ms.RestartStrategy(max_restarts=2, window_seconds=7.5)
    assert strategy.interval_seconds == 7.5
    assert strategy == ms.RestartStrategy(max_restarts=2, interval_seconds=7.5)


def test_restart_positional_arguments_keep_their_places() -> None:
    strategy = ms.RestartStrategy(3, 9.0, 0.1, 1.0)
    assert (strategy.max_restarts, strategy.interval_seconds) == (3, 9.0)
    assert (strategy.backoff_seconds, strategy.backoff_max_seconds) == (0.1, 1.0)


def test_pending_rows_old_names_read_the_new_ones() -> None:
    rows = pa.table({"k": [1, 2, 3]})
    pending = ms.PendingRows(rows, np.array([0, 0, 1], np.int32), frozenset({1}), 3)
    with pytest.warns(DeprecationWarning, match="PendingRows.partitions"):
        assert pending.mapper_indices.to_pylist() == [0, 0, 1]
    with pytest.warns(DeprecationWarning, match="PendingRows.ended_partitions"):
        assert pending.ended_mappers == frozenset({1})
    assert pending.partitions.to_pylist() == [0, 0, 1]
    assert pending.ended_partitions == frozenset({1})
