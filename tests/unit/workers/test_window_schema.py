"""The window's schema: mapped rows that widen restart ingestion with the widened schema
recorded, rows that fit are cast in, and a new instance starts from the record."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from millstream.exceptions import SplitBrainError, UserCodeError
from millstream.ledger import read_window_schema
from millstream.workers import MapperWorker

from tests.support.worker_fixtures import BATCH_ROWS, Cluster, expected_counts, tables

WIDE_FROM = 3 * BATCH_ROWS
"""Input rows from here on map to the wide schema."""


class WidensLater(ms.Mapper):
    """Rows before :data:`WIDE_FROM` map to ``(key, w int32)``; later ones to ``(note,
    key, w float64)`` (``config["w"]``: another type for ``w`` there)."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        n = batch.num_rows
        if int(pc.min(batch["row"]).as_py()) < WIDE_FROM:
            rows = pa.record_batch({"key": batch["key"], "w": pc.cast(batch["key"], pa.int32())})
        else:
            kind = self.config.get("w", pa.float64())
            w = pc.cast(batch["key"], pa.string() if kind == pa.string() else pa.float64())
            rows = pa.record_batch({"note": pa.nulls(n, pa.string()), "key": batch["key"], "w": w})
        return ms.Partitioned.by_hash(rows, key="key", num_reducers=self.spec.num_reducers)


def _tables() -> list[pa.Table]:
    return [t.append_column("row", pa.array(range(t.num_rows))) for t in tables()]


def test_a_widening_restarts_ingestion_with_the_schema_recorded(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), mapper=WidensLater)
    wide = pa.schema([("key", pa.int64()), ("w", pa.float64()), ("note", pa.string())])
    mapper = c.mappers[0]
    for _ in range(3):
        assert mapper.ingest_once()
    assert mapper.window_schema == pa.schema([("key", pa.int64()), ("w", pa.int32())])
    window = mapper.window
    assert not mapper.ingest_once(), "the widening batch restarts ingestion"
    assert mapper.window is not window
    assert mapper.window_schema is not None
    assert mapper.window_schema.equals(wide)
    with c.store.read() as txn:
        recorded = read_window_schema(txn, 0)
    assert recorded is not None
    assert recorded.equals(wide)
    # A new instance (a restart) casts the replayed narrow rows into the recorded schema.
    c.start_mapper(0)
    assert c.mappers[0].ingest_once()
    assert c.mappers[0].window_schema.equals(wide)
    c.run_to_end()
    assert c.output() == expected_counts(c.tables)
    c.store.close()


def test_at_least_once_a_widening_ends_the_instance_and_the_next_one_carries_it(
    tmp_path: Path,
) -> None:
    """At least once a restarted instance renumbers its rows, so rows the old window
    served must not be committed under its GUID: the instance ends (as on a split brain)
    and a new one (a new GUID) starts from the recorded schema."""
    c = Cluster(tmp_path, _tables(), mapper=WidensLater)
    processor = dataclasses.replace(c.processor, delivery="at_least_once")
    mapper = MapperWorker(processor, 0, c.store, clock=c.clock)
    mapper.start_ingestion()
    for _ in range(3):
        assert mapper.ingest_once()
    with pytest.raises(SplitBrainError, match="widened their schema at input row 300"):
        mapper.ingest_once()
    successor = MapperWorker(processor, 0, c.store, clock=c.clock)
    successor.start_ingestion()
    assert successor.ingest_once()
    assert successor.window_schema is not None
    assert successor.window_schema.names == ["key", "w", "note"]
    c.store.close()


def test_mapped_rows_that_do_not_unify_name_the_rows_and_the_column(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), mapper=WidensLater, config={"w": pa.string()})
    mapper = c.mappers[0]
    for _ in range(3):
        assert mapper.ingest_once()
    shuffled = mapper.window.snapshot().shuffle_end_row_index
    with pytest.raises(UserCodeError) as caught:
        mapper.ingest_once()
    message = str(caught.value)
    assert f"input rows [{WIDE_FROM}, {WIDE_FROM + BATCH_ROWS})" in message
    assert "column 'w' changed from int32 to string" in message
    assert mapper.window.snapshot().shuffle_end_row_index == shuffled, "nothing was pushed"
    c.store.close()
