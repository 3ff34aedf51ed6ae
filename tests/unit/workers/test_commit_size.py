"""A reducer sizes its commits by what the store's backend takes.

On SQLite, which has no transaction size limit of its own, a commit of several rows is
held to the limit in the bytes it stores, past FoundationDB's count (FoundationDB would
split it over more commits, as the reducer shrinks its fetch there); the writes of one row,
which no commit can split, are held to FoundationDB's count, so a row that could never
commit on FoundationDB fails on SQLite too, with the error naming it.
"""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import TransactionTooLargeError
from millstream.state.limits import StoreLimits

from tests.support.worker_fixtures import Cluster
from tests.support.worker_fixtures import expected_counts as _expected
from tests.support.worker_fixtures import tables as _tables

LIMITS = StoreLimits(max_transaction_bytes=3_000)


class FanOut(ms.Reducer):
    """Adds 1 to ``config["fan"]`` counters per row, under ``("fan", key, i)``."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        fan = pa.array(range(int(self.config["fan"])), pa.int64())
        for key in batch["key"].to_pylist():
            txn.add_many(("fan", key), fan, pa.array([1] * len(fan), pa.int64()))


def test_commits_of_several_rows_take_what_sqlite_takes(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), limits=LIMITS)
    sizes: list[int] = []
    for reducer in c.reducers.values():
        reducer.on_committed = lambda _latency, size, _rows, _fetched: sizes.append(size)
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    assert not any(r.last_error for r in c.reducers.values())
    # Past FoundationDB's count, under the limit in stored bytes: one commit where
    # FoundationDB would have made several.
    assert max(sizes) > LIMITS.max_transaction_bytes
    c.store.close()


def test_one_rows_writes_are_held_to_foundationdbs_count(tmp_path: Path) -> None:
    one_row = [pa.table({"key": pa.array([7], pa.int64())})]
    # 30 counters: under 3,000 bytes stored, over 4,000 as FoundationDB counts them.
    c = Cluster(
        tmp_path, one_row, num_reducers=1, reducer=FanOut, config={"fan": 30}, limits=LIMITS
    )
    c.mappers[0].ingest_once()
    with pytest.raises(TransactionTooLargeError, match="the writes of reduce for one row"):
        c.reducers[0].run_once()
    with c.store.read() as txn:
        assert txn.get_range_startswith(("out",)) == []
    c.store.close()
