"""The embedded store's delta runs: what a reducer's commit encodes before it takes the
write lock (one run of its ``add_many``), and what a merge decodes (eight runs) and encodes.

Runs of the keyed sum's shape: ``("sum", key)`` keys over 100,000 int64 keys, one int64
delta each, at the sizes of one commit at half of peak load (600 keys), of a merged group
(5,000) and of a backlog's commit (50,000).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from millstream.state.keys import encode_keys, pack
from millstream.state.sqlite.runs import Run

from bench.micro.conftest import KEYS

SIZES = [600, 5_000, 50_000]


def _run(keys: int) -> Run:
    rng = np.random.default_rng(keys)
    chosen = pa.array(rng.choice(max(KEYS, keys), keys, replace=False).astype(np.int64))
    deltas = rng.integers(0, 1_000_000, keys).tolist()
    return Run.of_batch(encode_keys(pack(("sum",)), chosen), deltas)


@pytest.mark.parametrize("keys", SIZES)
def test_run_encode(benchmark: Any, keys: int) -> None:
    """A run to its stored bytes."""
    run = _run(keys)
    benchmark.extra_info["stored_bytes"] = len(run.encode())
    benchmark(run.encode)


@pytest.mark.parametrize("keys", SIZES)
def test_run_decode(benchmark: Any, keys: int) -> None:
    """Stored bytes back to a run."""
    run = _run(keys)
    data = run.encode()
    back = benchmark(Run.decode, data)
    assert back.keys.to_pylist() == run.keys.to_pylist()
