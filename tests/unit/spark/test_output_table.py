"""Reading a reducer's output keyspace back as a table: one counter or several per key."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import ConfigurationError
from millstream.spark import output_table
from millstream.testing import MemoryInput, run_in_process


class Split(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class SumCountAndTotal(ms.Reducer):
    """Keeps each key's sum and count in one value, and its sum alone as a counter."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        folded = (
            pa.Table.from_batches([batch])
            .group_by("key", use_threads=False)
            .aggregate([("value", "sum"), ([], "count_all")])
        )
        keys = folded["key"].combine_chunks()
        txn.add_many(("stats",), keys, folded.select(["value_sum", "count_all"]))
        txn.add_many(("sum",), keys, folded["value_sum"].combine_chunks())


@pytest.fixture
def processor(tmp_path: Path) -> ms.Processor:
    partitions = [
        pa.table({"key": [1, 2, 1, 3], "value": [5, 6, 7, -1]}),
        pa.table({"key": [2, 3], "value": [1, -2]}),
    ]
    processor = ms.Processor(
        mapper=Split,
        reducer=SumCountAndTotal,
        input=MemoryInput(partitions),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=2,
    )
    run_in_process(processor)
    return processor


def test_several_counters_per_key_read_as_named_columns(processor: ms.Processor) -> None:
    table = output_table(processor, ("stats",), value_name=("sum", "count"))
    assert table.to_pydict() == {"key": [1, 2, 3], "sum": [12, 7, -3], "count": [2, 2, 2]}
    one = output_table(processor, ("sum",))
    assert one.to_pydict() == {"key": [1, 2, 3], "value": [12, 7, -3]}


def test_unnamed_counters_are_refused_not_cut(processor: ms.Processor) -> None:
    with pytest.raises(ConfigurationError, match="hold up to 2 counters"):
        output_table(processor, ("stats",))
