"""The reducer's decode: GetRows payloads (Arrow IPC streams) to one record batch.

``_core.decode_ipc`` is what a reducer runs on the payloads of one round before ``reduce``:
decode every stream and concatenate the rows. Measured on payloads of the benchmark's row
shape (two int64 columns and a 64-byte string, about 100 bytes a row), as one mapper's
answer and as four mappers' answers of 32,768 rows each, and on the pre-aggregated shape
of the keyed sum (two int64 columns).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from millstream import _core

from bench.micro.conftest import input_batch

SHAPES = {
    "1x32768rows": (1, 32_768, False),
    "4x32768rows": (4, 32_768, False),
    "2x50000sums": (2, 50_000, True),
}


def _payload(rows: int, seed: int, sums: bool) -> bytes:
    batch = input_batch(rows, seed)
    if sums:
        batch = batch.select(["key", "value"])
    window = _core.Window(1, 1 << 31)
    window.push(batch, pa.array([0] * rows, pa.int32()), rows, b"")
    return window.get_rows(0, -1, rows, 1 << 30)[2]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_decode_ipc(benchmark: Any, shape: str) -> None:
    """Decode and concatenate the payloads of one reducer round."""
    mappers, rows, sums = SHAPES[shape]
    payloads = [_payload(rows, seed, sums) for seed in range(mappers)]
    benchmark.extra_info["rows"] = mappers * rows
    benchmark.extra_info["bytes"] = sum(len(p) for p in payloads)
    batch = benchmark(_core.decode_ipc, payloads)
    assert batch.num_rows == mappers * rows
