"""What the event-time window tests share: a stream of timestamped rows out of order, and
one reducer commit made by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
from millstream.outputs import ParquetSink, StagedOutputs

MINUTE = 60_000
"""One minute in milliseconds, the streams' time unit."""


def stream(partitions: int, rows: int, *, disorder: int, seed: int = 5) -> list[pa.Table]:
    """Rows about 10 ms apart per partition, each up to ``disorder`` ms out of order."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(partitions):
        ts = np.arange(rows, dtype=np.int64) * 10 + rng.integers(0, disorder + 1, rows)
        keys = rng.integers(0, 20, rows, dtype=np.int64)
        values = rng.integers(-100, 100, rows, dtype=np.int64)
        out.append(pa.table({"ts": ts, "key": keys, "value": values}))
    return out


def commit_round(
    store: Any,
    sink: ParquetSink | list[ParquetSink],
    write: Callable[[ms.Transaction], None],
    reducer: int = 0,
) -> None:
    """One reducer transaction by hand: ``write`` through it, then commit it with what it
    staged for ``sink`` (or each of a list; as reducer ``reducer``) and publish that."""
    txn = store.create_transaction()
    outputs = StagedOutputs(sink if isinstance(sink, list) else [sink], f"reducer-{reducer}", 0)
    write(ms.Transaction(txn, outputs))
    outputs.apply(txn)
    txn.commit()
    outputs.publish()
