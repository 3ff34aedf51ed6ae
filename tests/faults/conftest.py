"""Fixtures of the fault tests."""

from __future__ import annotations

import pytest
from millstream.inputs import queue_chunks, store_queue
from millstream.state.sqlite import run_merge, run_writer


@pytest.fixture
def small_store_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thresholds small enough for programs of a dozen operations to merge and fold runs
    and to append in several pieces."""
    monkeypatch.setattr(run_merge, "MERGE_ABOVE", 2)
    monkeypatch.setattr(run_merge, "FANOUT", 2)
    monkeypatch.setattr(run_writer, "MAX_RUNS", 4)
    monkeypatch.setattr(queue_chunks, "CHUNK_BYTES", 80)  # 10 int64 rows a chunk
    monkeypatch.setattr(store_queue, "TRANSACTION_BYTES", 1)  # a piece per chunk
