"""A mapper reads ``Tuning.batch_rows`` per batch, fewer when its rows are wide."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pyarrow as pa
from millstream.workers.mapper_worker.batch_size import FIRST_BATCH_ROWS, WINDOW_SHARE, BatchSize

from tests.support.worker_fixtures import BATCH_ROWS, Cluster, PassThrough
from tests.support.worker_fixtures import expected_counts as _expected
from tests.support.worker_fixtures import tables as _tables


def test_the_first_read_is_small_until_the_rows_width_is_known() -> None:
    assert BatchSize(1_048_576, 256 << 20).rows() == FIRST_BATCH_ROWS
    assert BatchSize(1_000, 256 << 20).rows() == 1_000


def test_narrow_rows_read_whole_batches() -> None:
    size = BatchSize(1_048_576, 256 << 20)
    size.saw(FIRST_BATCH_ROWS, read_bytes=16 * FIRST_BATCH_ROWS, mapped_bytes=2_000)
    assert size.rows() == 1_048_576


def test_wide_rows_read_or_mapped_fit_a_share_of_the_window() -> None:
    limit = 256 << 20
    wide_read, wide_mapped = BatchSize(1_048_576, limit), BatchSize(1_048_576, limit)
    wide_read.saw(1_000, read_bytes=1_000 * 1_000, mapped_bytes=10)
    wide_mapped.saw(1_000, read_bytes=10, mapped_bytes=1_000 * 1_000)
    assert wide_read.rows() == wide_mapped.rows() == limit // WINDOW_SHARE // 1_000


def test_the_widest_recent_batch_decides_and_a_batch_holds_a_row() -> None:
    size = BatchSize(1_000_000, 4_000)
    size.saw(10, read_bytes=100_000, mapped_bytes=0)  # 10 kB a row: more than the budget
    size.saw(10, read_bytes=10, mapped_bytes=10)
    assert size.rows() == 1


class RecordsBatches(PassThrough):
    """Routes rows like :class:`PassThrough` and notes each batch's rows in the config."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        self.config["rows"].append(batch.num_rows)
        return super().map(batch)


def test_a_mapper_with_wide_rows_reads_smaller_batches_and_stays_exact(tmp_path: Path) -> None:
    limit = 2_400  # a quarter holds fewer than BATCH_ROWS rows of an 8-byte key
    seen: list[int] = []
    c = Cluster(
        tmp_path,
        _tables(),
        mapper=RecordsBatches,
        config={"rows": seen},
        memory_limit_bytes=limit,
    )
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    assert seen[0] == BATCH_ROWS
    assert 0 < max(seen[2:]) * 8 <= limit // WINDOW_SHARE < BATCH_ROWS * 8
    c.store.close()
