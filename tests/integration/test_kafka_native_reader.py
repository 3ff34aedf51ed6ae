"""The Rust core's Kafka reader against confluent-kafka: the same topic read through both
gives the same rows, every column (plain and compressed batches, transactions with aborted
records, headers, null keys and values, several partitions); a broker stopped mid-read and
started again loses and doubles nothing.

Run against a noida-db broker started for the session, or against the Kafka named by
``MILLSTREAM_KAFKA_BOOTSTRAP`` (the restart test needs a broker of its own).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import millstream as ms
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from millstream._core import KafkaPartitionReader
from millstream.exceptions import ConfigurationError, InputError
from millstream.inputs import kafka_core_reader

from tests.support.kafka_broker import (
    BOOTSTRAP_VARIABLE,
    delete_records,
    new_topic,
    noida_broker,
    produce,
)


def _read_all(topic: ms.inputs.KafkaTopic, batch_rows: int = 700) -> pa.Table:
    """Every record of a bounded topic, read as a mapper reads: batches of ``batch_rows``
    from the token each read returns."""
    batches = []
    for partition in range(topic.num_partitions):
        reader = topic.reader(partition)
        token, rows = b"", 0
        try:
            while True:
                result = reader.read(rows, rows + batch_rows, token)
                if result.batch is not None:
                    assert result.batch.num_rows <= batch_rows
                    batches.append(result.batch)
                    rows += result.batch.num_rows
                token = result.continuation_token
                if result.end_of_input:
                    break
        finally:
            reader.close()
    table = pa.Table.from_batches(batches, schema=topic.schema)
    order = [c for c in ("partition", "offset") if c in table.column_names]
    return table.sort_by([(c, "ascending") for c in order])


def _both(bootstrap: str, name: str, **options: Any) -> tuple[pa.Table, pa.Table]:
    native = ms.inputs.KafkaTopic(bootstrap, name, bounded=True, native_reader=True, **options)
    librdkafka = ms.inputs.KafkaTopic(bootstrap, name, bounded=True, native_reader=False, **options)
    return _read_all(native), _read_all(librdkafka)


def _produce_varied(bootstrap: str, name: str, partitions: int, settings: dict[str, Any]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **settings})
    for i in range(3_000):
        key = None if i % 7 == 0 else f"k{i % 50}".encode()
        value = None if i % 11 == 0 else (f"value {i} " * (1 + i % 5)).encode()
        headers = [("n", str(i).encode()), ("empty", None)] if i % 3 == 0 else None
        producer.produce(name, value, key, partition=i % partitions, headers=headers)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def test_plain_records_match_every_column(kafka_bootstrap: str) -> None:
    name = new_topic(kafka_bootstrap, 3)
    _produce_varied(kafka_bootstrap, name, 3, {})
    native, librdkafka = _both(kafka_bootstrap, name)
    assert native.num_rows == 3_000
    assert native.equals(librdkafka)
    assert native.column("headers").null_count == 2_000
    assert native.column("key").null_count == len(range(0, 3_000, 7))


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_match(kafka_bootstrap: str, codec: str) -> None:
    name = new_topic(kafka_bootstrap, 2)
    _produce_varied(kafka_bootstrap, name, 2, {"compression.type": codec})
    native, librdkafka = _both(kafka_bootstrap, name)
    assert native.num_rows == 3_000
    assert native.equals(librdkafka)


def test_aborted_transactions_and_markers_match(kafka_bootstrap: str) -> None:
    name = new_topic(kafka_bootstrap, 2)
    txn = f"native-{uuid.uuid4().hex[:8]}"
    produce(kafka_bootstrap, name, [(p, b"plain", b"p%d" % i) for i in range(40) for p in (0, 1)])
    for round_ in range(6):
        records = [(i % 2, b"t", b"r%d-%d" % (round_, i)) for i in range(30)]
        produce(kafka_bootstrap, name, records, transactional_id=txn, abort=round_ % 2 == 1)
    produce(kafka_bootstrap, name, [(0, None, b"last")], headers=[("h", b"v")])
    native, librdkafka = _both(kafka_bootstrap, name)
    assert native.equals(librdkafka)
    values = native.column("value").to_pylist()
    assert native.num_rows == 80 + 3 * 30 + 1
    assert not any(v.startswith((b"r1-", b"r3-", b"r5-")) for v in values)
    # Offsets have gaps where the markers and aborted records sit; tokens skip them.
    assert native.column("offset").to_pylist() != list(range(native.num_rows))


def test_decoders_and_columns_apply_on_the_native_path(kafka_bootstrap: str) -> None:
    name = new_topic(kafka_bootstrap, 1)
    produce(kafka_bootstrap, name, [(0, None, b'{"key": %d, "value": 1}' % i) for i in range(50)])
    schema = pa.schema([("key", pa.int64()), ("value", pa.int64())])
    native, librdkafka = _both(
        kafka_bootstrap, name, value=ms.inputs.Json(schema), columns=("offset", "value")
    )
    assert native.equals(librdkafka)
    assert native.schema.names == ["offset", "value"]
    produce(kafka_bootstrap, name, [(0, None, b"not json")])
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, bounded=True, native_reader=True, value=ms.inputs.Json(schema)
    )
    with pytest.raises(InputError, match="the record at offset 50 does not decode"):
        _read_all(topic)


def test_retention_loss_names_the_range_on_the_native_path(kafka_bootstrap: str) -> None:
    name = new_topic(kafka_bootstrap, 1)
    produce(kafka_bootstrap, name, [(0, None, b"%d" % i) for i in range(30)])
    delete_records(kafka_bootstrap, name, 0, 20)
    topic = ms.inputs.KafkaTopic(kafka_bootstrap, name, bounded=True, native_reader=True)
    reader = topic.reader(0)
    try:
        with pytest.raises(InputError, match=r"records \[0, 20\) were deleted"):
            reader.read(0, 100, b"")
    finally:
        reader.close()


def test_native_reader_refuses_tls_and_sasl(kafka_bootstrap: str) -> None:
    name = new_topic(kafka_bootstrap, 1)
    with pytest.raises(ConfigurationError, match="plain connections only"):
        ms.inputs.KafkaTopic(
            kafka_bootstrap, name, native_reader=True, config={"security.protocol": "SSL"}
        )
    topic = ms.inputs.KafkaTopic(kafka_bootstrap, name, config={"sasl.username": "u"})
    assert topic.native_reader is False
    assert ms.inputs.KafkaTopic(kafka_bootstrap, name).native_reader is True


@pytest.mark.slow
@pytest.mark.skipif(
    bool(os.environ.get(BOOTSTRAP_VARIABLE)), reason="restarts a broker of its own (noida-db)"
)
def test_a_broker_stopped_mid_read_loses_and_doubles_nothing() -> None:
    with noida_broker() as broker:
        name = new_topic(broker.bootstrap, 1)
        produce(broker.bootstrap, name, [(0, None, b"%d" % i) for i in range(5_000)])
        reader = KafkaPartitionReader(
            broker.bootstrap, name, 0, 0, 20_000, fetch_bytes=64 << 10, timeout_seconds=2.0
        )
        offsets: list[int] = []
        stopped = False
        deadline = time.monotonic() + 120
        while not reader.ended() and time.monotonic() < deadline:
            batch = reader.read(1_000, 0.5)
            if batch is not None:
                offsets.extend(batch.column("offset").to_pylist())
                assert batch.column("value").to_pylist() == [
                    b"%d" % o for o in offsets[-batch.num_rows :]
                ]
            if not stopped and len(offsets) >= 5_000:
                # The reader's thread has its next fetch in flight as the broker stops.
                broker.stop()
                stopped = True
                time.sleep(1.0)
                broker.start()
                more = [(0, None, b"%d" % i) for i in range(5_000, 20_000)]
                produce(broker.bootstrap, name, more)
        assert stopped
        assert offsets == list(range(20_000))


def test_a_small_read_ahead_holds_the_reader_back_and_loses_nothing(kafka_bootstrap: str) -> None:
    """With room for one decoded response, the reader's thread waits for the caller after
    each; every record still comes once, in order."""
    name = new_topic(kafka_bootstrap, 1)
    for round_ in range(5):
        produce(kafka_bootstrap, name, [(0, None, b"%d" % (round_ * 400 + i)) for i in range(400)])
    reader = KafkaPartitionReader(
        kafka_bootstrap, name, 0, 0, 2_000, fetch_bytes=4 << 10, read_ahead_bytes=1
    )
    offsets: list[int] = []
    deadline = time.monotonic() + 60
    while not reader.ended() and time.monotonic() < deadline:
        batch = reader.read(150, 0.5)
        if batch is not None:
            offsets.extend(batch.column("offset").to_pylist())
            assert batch.column("value").to_pylist() == [b"%d" % o for o in offsets[-len(batch) :]]
            time.sleep(0.01)  # a slow caller: the thread waits for room
    assert offsets == list(range(2_000))


@pytest.mark.skipif(
    bool(os.environ.get(BOOTSTRAP_VARIABLE)), reason="stops a broker of its own (noida-db)"
)
def test_a_broker_that_stays_away_is_warned_of_and_reading_goes_on_after(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_core_reader, "RETRY_WARNING_SECONDS", 0.5)
    with noida_broker() as broker:
        name = new_topic(broker.bootstrap, 1)
        produce(broker.bootstrap, name, [(0, None, b"%d" % i) for i in range(100)])
        topic = ms.inputs.KafkaTopic(broker.bootstrap, name, native_reader=True)
        reader = topic.reader(0)
        try:
            first = reader.read(0, 1_000, b"")
            while first.batch is None:
                reader.wait_for_rows(0, 1.0)
                first = reader.read(0, 1_000, first.continuation_token)
            assert first.batch.num_rows == 100
            broker.stop()
            with caplog.at_level(logging.WARNING, logger=kafka_core_reader.__name__):
                deadline = time.monotonic() + 30
                while "no fetch got through" not in caplog.text:
                    assert time.monotonic() < deadline, "no warning while the broker was away"
                    result = reader.read(100, 1_000, first.continuation_token)
                    assert result.batch is None  # nothing skipped, nothing made up
                    reader.wait_for_rows(100, 0.2)
                warning = next(r for r in caplog.records if "no fetch got through" in r.message)
                assert f"topic {name!r} partition 0" in warning.message
                assert "check that it runs and is reachable" in warning.message
                broker.start()
                produce(broker.bootstrap, name, [(0, None, b"%d" % i) for i in range(100, 150)])
                rows: list[bytes] = []
                token = first.continuation_token
                while len(rows) < 50:
                    assert time.monotonic() < deadline + 60, "reading did not go on"
                    result = reader.read(100 + len(rows), 1_000, token)
                    token = result.continuation_token
                    if result.batch is not None:
                        rows.extend(result.batch.column("value").to_pylist())
                assert rows == [b"%d" % i for i in range(100, 150)]
                assert "a fetch got through again" in caplog.text
        finally:
            reader.close()
