"""Kafka to Kafka through an event-time window aggregation under kill -9 of workers, the
fork server and publishers: tumbling minutes per key over a topic whose record timestamps
are the event times (out of order), published by a KafkaSink; a read_committed consumer of
the output topic sees every pane once, equal to the panes pyarrow computes alone."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
import pytest
from millstream.runner.local import LocalRunner

from tests.support.chaos import RandomKiller
from tests.support.jobs import EVENT_DISORDER_MS, EVENT_PANES, tuning
from tests.support.kafka_broker import committed_values, new_topic

ROWS = 40_000
OUTPUT_COLUMNS = [ms.event_time.START, "key", "n", "total", "high"]


class RecordsToPanes(ms.event_time.PaneMapper):
    """The records' timestamps as event time ``ts``; key and value are the record value's
    two little-endian int64s; sleeps ``config["map_seconds"]`` per batch."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        time.sleep(float(self.config.get("map_seconds", 0.0)))
        raw = b"".join(batch.column("value").to_pylist())
        pairs = np.frombuffer(raw, dtype="<i8").reshape(-1, 2)
        ts = batch.column("timestamp").cast(pa.int64())
        rows = pa.record_batch({"ts": ts, "key": pairs[:, 0], "value": pairs[:, 1]})
        return super().map(rows)


class _Encoded:
    """A transaction whose ``emit`` turns window rows into Kafka records: the value is the
    row's five int64 columns, little-endian."""

    def __init__(self, txn: ms.Transaction) -> None:
        self._txn = txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)

    def emit(self, output: str, rows: pa.RecordBatch | pa.Table) -> None:
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
        if table.num_rows == 0:
            return
        columns = [np.asarray(table[c].to_numpy(), dtype="<i8") for c in OUTPUT_COLUMNS]
        packed = np.stack(columns, axis=1)
        values = [row.tobytes() for row in packed]
        self._txn.emit(output, pa.table({"value": pa.array(values, type=pa.binary())}))


class PanesToKafka(ms.event_time.PaneReducer):
    """The pane reducer, its closed panes published to the Kafka sink."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        super().reduce(batch, _Encoded(txn))  # type: ignore[arg-type]

    def drain(self, txn: ms.Transaction) -> None:
        super().drain(_Encoded(txn))  # type: ignore[arg-type]


def _fill(bootstrap: str, topic: str) -> pa.Table:
    """``ROWS`` records over 2 partitions, about 100 a second per partition, each up to
    the disorder out of order (its timestamp); returns the rows ``(ts, key, value)``."""
    from confluent_kafka import Producer

    rng = np.random.default_rng(17)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    per_partition = ROWS // 2
    # Event times from now on: a broker's time retention deletes records stamped long ago.
    start = int(time.time() * 1000)
    tables = []
    for p in range(2):
        ts = np.arange(per_partition, dtype=np.int64) * 10
        ts += rng.integers(0, EVENT_DISORDER_MS + 1, per_partition) + start
        keys = rng.integers(0, 50, per_partition, dtype=np.int64)
        values = rng.integers(-1000, 1000, per_partition, dtype=np.int64)
        for t, k, v in zip(ts.tolist(), keys.tolist(), values.tolist(), strict=True):
            value = np.array([k, v], dtype="<i8").tobytes()
            while True:
                try:
                    producer.produce(topic, value=value, partition=p, timestamp=t)
                    break
                except BufferError:
                    producer.poll(0.1)
        tables.append(pa.table({"ts": ts, "key": keys, "value": values}))
    assert producer.flush(60) == 0
    return pa.concat_tables(tables)


def _expected(rows: pa.Table) -> Counter[tuple[int, ...]]:
    minute = EVENT_PANES.size
    starts = pa.array((rows["ts"].to_numpy() // minute) * minute)
    grouped = (
        rows.append_column(ms.event_time.START, starts)
        .group_by([ms.event_time.START, "key"])
        .aggregate([([], "count_all"), ("value", "sum"), ("value", "max")])
    )
    columns = [ms.event_time.START, "key", "count_all", "value_sum", "value_max"]
    return Counter(zip(*(grouped[c].to_pylist() for c in columns), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [21, 22])
def test_kafka_panes_to_kafka_under_kill_9_every_pane_once(
    kafka_bootstrap: str, tmp_path: Path, seed: int
) -> None:
    source, sink = new_topic(kafka_bootstrap, 2), new_topic(kafka_bootstrap, 2)
    rows = _fill(kafka_bootstrap, source)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    target = ms.outputs.KafkaTarget(kafka_bootstrap, sink)
    processor = ms.Processor(
        mapper=RecordsToPanes,
        reducer=PanesToKafka,
        input=ms.inputs.KafkaTopic(kafka_bootstrap, source, bounded=True),
        store=store,
        num_reducers=2,
        outputs=[ms.outputs.KafkaSink(store, EVENT_PANES.output, 2, target)],
        config={"panes": EVENT_PANES, "map_seconds": 0.04},
        tuning=tuning(
            batch_rows=2_000,
            commit_interval_seconds=0.1,
            restart=ms.RestartStrategy(max_restarts=1_000),
        ),
    )
    runner = LocalRunner(processor)
    runner.start()
    assert runner.publishers is not None
    rng = random.Random(seed)
    published_kills = 0
    deadline = time.monotonic() + 300
    try:
        with RandomKiller(runner, seed) as killer:  # workers and the fork server
            while not runner.poll():  # and the publishers, at work
                live = runner.publishers.pids()
                if live and published_kills < 4 and rng.random() < 0.05:
                    os.kill(rng.choice(sorted(live.values())), signal.SIGKILL)
                    published_kills += 1
                assert time.monotonic() < deadline, "not drained in 300 s"
                time.sleep(0.05)
            summary = runner.finish()
    finally:
        runner.stop()
    assert killer.kills, "the killer never found a live process"
    assert published_kills, "no publisher was killed"
    assert summary.rows_read == ROWS
    assert ms.event_time.late_rows(processor) == 0
    got: Counter[tuple[int, ...]] = Counter()
    for value, count in committed_values(kafka_bootstrap, sink).items():
        got[tuple(np.frombuffer(value, dtype="<i8").tolist())] += count
    assert max(got.values()) == 1, "a window reached read_committed consumers twice"
    assert got == _expected(rows)
    print(f"seed {seed}: killed {killer.kills} and {published_kills} publishers")
