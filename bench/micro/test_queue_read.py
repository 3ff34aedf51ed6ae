"""A mapper's read of a :class:`~millstream.inputs.StoreQueue` partition on the embedded store.

Each read follows another connection's append (as in a running pipeline, where the
producer commits between the mapper's reads), so the reader's page cache starts empty.
``backlog`` is how many 625-row chunks (a 10 ms tick at 62,500 rows/s) other partitions
hold beside it: large values whose pages a search must not read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from millstream.inputs import StoreQueue

from bench.micro.conftest import input_batch

ROWS = 625
BACKLOGS = [0, 2_000]


@pytest.fixture(params=BACKLOGS, ids=lambda n: f"backlog{n}")
def queues(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[StoreQueue, StoreQueue]]:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    writer, reader = StoreQueue(url, "in", 2), StoreQueue(url, "in", 2)
    batch = input_batch(ROWS)
    for _ in range(int(request.param)):
        writer.append(1, batch)
    yield writer, reader
    reader.close()
    writer.close()


def test_queue_read_after_an_append(benchmark: Any, queues: tuple[StoreQueue, StoreQueue]) -> None:
    """Read the chunk another connection has just appended (one transaction)."""
    writer, reader = queues
    batch = input_batch(ROWS)
    position = {"next": 0}
    got: list[pa.RecordBatch] = []

    def append() -> None:
        writer.append(0, batch)

    def read() -> None:
        result = reader.read(0, position["next"], ROWS)
        assert result.batch is not None
        got.append(result.batch)
        position["next"] += result.batch.num_rows

    benchmark.pedantic(read, setup=append, rounds=200, warmup_rounds=5)
    assert [b.num_rows for b in got] == [ROWS] * len(got)
    assert position["next"] == ROWS * len(got)
