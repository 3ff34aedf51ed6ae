"""Fixtures of the Python-layer micro-benchmarks (see ``bench/micro/__init__.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from millstream.state import Store, open_store

KEYS = 100_000


def input_batch(rows: int, seed: int = 1) -> pa.RecordBatch:
    """Rows of the benchmark shape: int64 key over 100,000 keys, int64 value, 64-byte payload."""
    rng = np.random.default_rng(seed)
    payload = pa.array([b"p" * 64] * rows, pa.binary(64)).cast(pa.string())
    return pa.record_batch(
        [
            pa.array(rng.integers(0, KEYS, rows, dtype=np.int64)),
            pa.array(rng.integers(0, 1_000_000, rows, dtype=np.int64)),
            payload,
        ],
        names=["key", "value", "payload"],
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh embedded store on disk (``synchronous=FULL``, the default)."""
    s = open_store(f"sqlite:///{tmp_path / 'state.db'}", prefix=("bench",))
    yield s
    s.close()
