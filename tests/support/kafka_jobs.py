"""Jobs over Kafka topics for the integration tests: the keyed sum with keys and values
as JSON or as two little-endian int64s, and a topic filled with known rows.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa

from tests.support.kafka_broker import produce

VALUE_SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.int64())])
"""The JSON values' fields."""


class JsonKeyedSumMapper(ms.Mapper):
    """Sums the JSON values' ``value`` per ``key`` within the batch, routes keys by hash."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        values = batch.column("value")
        rows = pa.table({"key": values.field("key"), "value": values.field("value")})
        sums = rows.group_by("key", use_threads=False).aggregate([("value", "sum")])
        sums = sums.rename_columns(["key", "value"])
        if self.config.get("map_seconds"):
            time.sleep(float(self.config["map_seconds"]))
        return ms.Partitioned.by_hash(sums, key="key", num_reducers=self.spec.num_reducers)


class PackedKeyedSumMapper(ms.Mapper):
    """The same over raw values of two little-endian int64s (key, value)."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        raw = b"".join(batch.column("value").to_pylist())
        pairs = np.frombuffer(raw, dtype="<i8").reshape(-1, 2)
        rows = pa.table({"key": pairs[:, 0], "value": pairs[:, 1]})
        sums = rows.group_by("key", use_threads=False).aggregate([("value", "sum")])
        sums = sums.rename_columns(["key", "value"])
        if self.config.get("map_seconds"):
            time.sleep(float(self.config["map_seconds"]))
        return ms.Partitioned.by_hash(sums, key="key", num_reducers=self.spec.num_reducers)


class OffsetsReducer(ms.Reducer):
    """Counts each record ``(partition, offset)`` it receives, under ``("seen", p, o)``."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        for p, o in zip(
            batch.column("partition").to_pylist(), batch.column("offset").to_pylist(), strict=True
        ):
            txn.add(("seen", f"{p}:{o}"), 1)


class PassRecordsMapper(ms.Mapper):
    """Sends each record's partition and offset to a reducer chosen by its offset."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        rows = pa.table({"partition": batch.column("partition"), "offset": batch.column("offset")})
        return ms.Partitioned.by_hash(rows, key="offset", num_reducers=self.spec.num_reducers)


def fill_keyed(
    bootstrap: str,
    topic: str,
    rows: int,
    partitions: int,
    *,
    packed: bool = False,
    seed: int = 7,
    transactional_id: str | None = None,
) -> Counter[int]:
    """Produce ``rows`` records of random keys (0-499) and values to the partitions in turn
    (as JSON, or packed int64 pairs); returns the true sum per key."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 500, rows, dtype=np.int64)
    values = rng.integers(-1000, 1000, rows, dtype=np.int64)
    records: list[tuple[int, bytes | None, bytes | None]] = []
    sums: Counter[int] = Counter()
    for i, (k, v) in enumerate(zip(keys.tolist(), values.tolist(), strict=True)):
        if packed:
            value = np.array([k, v], dtype="<i8").tobytes()
        else:
            value = f'{{"key": {k}, "value": {v}}}'.encode()
        records.append((i % partitions, str(k).encode(), value))
        sums[k] += v
    produce(bootstrap, topic, records, transactional_id=transactional_id)
    return sums


def exact(sums: Counter[int]) -> dict[Any, int]:
    """The sums as the store holds them (keys whose sum is 0 are still written)."""
    return dict(sums)


class SumsToKafkaQueueReducer(ms.Reducer):
    """Sums ``value`` per ``key`` within the batch and appends the sums, as records (key:
    the key as text, value: two little-endian int64s), to the queue ``config["queue"]``."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        sums = pa.Table.from_batches([batch]).group_by("key", use_threads=False)
        table = sums.aggregate([("value", "sum")])
        keys = table["key"].to_numpy()
        values = table["value_sum"].to_numpy()
        packed = np.stack([keys, values], axis=1).astype("<i8")
        records = pa.table(
            {
                "key": [str(k).encode() for k in keys.tolist()],
                "value": [row.tobytes() for row in packed],
            }
        )
        txn.append(self.config["queue"], records)
