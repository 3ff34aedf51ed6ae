"""A Kafka topic as the input: exact sums, transactions, retention loss, bad records.

Run against a noida-db broker started for the session, or against the Kafka named by
``MILLSTREAM_KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import fastavro
import millstream as ms
import pytest
from millstream.exceptions import ConfigurationError, InputError
from millstream.runner.local import LocalRunner

from tests.support.jobs import KeyedSumReducer, read_output, tuning
from tests.support.kafka_broker import delete_records, new_topic, produce
from tests.support.kafka_jobs import (
    VALUE_SCHEMA,
    JsonKeyedSumMapper,
    OffsetsReducer,
    PassRecordsMapper,
    fill_keyed,
)


def _processor(
    topic: ms.inputs.KafkaTopic,
    state: Path,
    *,
    mapper: type[ms.Mapper] = JsonKeyedSumMapper,
    reducer: type[ms.Reducer] = KeyedSumReducer,
    num_mappers: int = 0,
    **tune: Any,
) -> ms.Processor:
    return ms.Processor(
        mapper=mapper,
        reducer=reducer,
        input=topic,
        store=f"sqlite:///{state}",
        num_reducers=2,
        num_mappers=num_mappers,
        tuning=tuning(**{"batch_rows": 2_000, **tune}),
    )


def _fails(processor: ms.Processor, error: type[Exception]) -> str:
    runner = LocalRunner(processor)
    with pytest.raises(error) as caught:
        runner.run(timeout=120)
    assert runner.pids() == {}, "the runner must stop every worker, not restart them"
    return str(caught.value)


@pytest.mark.parametrize("num_mappers", [0, 1], ids=["mapper-per-partition", "one-mapper"])
def test_keyed_sum_from_a_topic_is_exact(
    kafka_bootstrap: str, tmp_path: Path, num_mappers: int
) -> None:
    name = new_topic(kafka_bootstrap, 3)
    sums = fill_keyed(kafka_bootstrap, name, 12_000, 3)
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True
    )
    processor = _processor(topic, tmp_path / "state.db", num_mappers=num_mappers)
    summary = LocalRunner(processor).run(timeout=120)
    assert read_output(processor, "sum") == dict(sums)
    assert summary.rows_read == 12_000


def test_columns_read_only_the_named_ones(kafka_bootstrap: str, tmp_path: Path) -> None:
    name = new_topic(kafka_bootstrap, 2)
    sums = fill_keyed(kafka_bootstrap, name, 6_000, 2, seed=3)
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True, columns=("value",)
    )
    assert topic.schema.names == ["value"]
    reader = topic.reader(0)
    try:
        batch = reader.read(0, 10, b"").batch
    finally:
        reader.close()
    assert batch is not None
    assert batch.schema.names == ["value"]
    assert batch.num_rows == 10
    processor = _processor(topic, tmp_path / "state.db")
    assert LocalRunner(processor).run(timeout=120).rows_read == 6_000
    assert read_output(processor, "sum") == dict(sums)
    for bad in [("value", "size"), (), ("key", "key")]:
        with pytest.raises(ConfigurationError, match="columns must name"):
            ms.inputs.KafkaTopic(kafka_bootstrap, name, columns=bad)


def test_bounded_stops_at_the_end_seen_when_built(kafka_bootstrap: str, tmp_path: Path) -> None:
    name = new_topic(kafka_bootstrap, 2)
    sums = fill_keyed(kafka_bootstrap, name, 4_000, 2, seed=1)
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True
    )
    fill_keyed(kafka_bootstrap, name, 1_000, 2, seed=2)  # after the end offsets were read
    processor = _processor(topic, tmp_path / "state.db")
    summary = LocalRunner(processor).run(timeout=120)
    assert read_output(processor, "sum") == dict(sums)
    assert summary.rows_read == 4_000


def test_aborted_transactions_are_ignored(kafka_bootstrap: str, tmp_path: Path) -> None:
    name = new_topic(kafka_bootstrap, 2)
    txn = f"writer-{uuid.uuid4().hex}"
    expected: list[tuple[int, bytes]] = []
    for number, abort in enumerate([False, True, False, True, True, False]):
        records = [(i % 2, None, f"{number}-{i}".encode()) for i in range(300)]
        produce(kafka_bootstrap, name, records, transactional_id=txn, abort=abort)
        if not abort:
            expected.extend((p, v) for p, _, v in records if v is not None)
    topic = ms.inputs.KafkaTopic(kafka_bootstrap, name, bounded=True)
    # Batches of 100 rows: reads resume after the gaps many times.
    processor = _processor(
        topic,
        tmp_path / "state.db",
        mapper=PassRecordsMapper,
        reducer=OffsetsReducer,
        batch_rows=100,
    )
    summary = LocalRunner(processor).run(timeout=120)
    seen = read_output(processor, "seen")
    assert summary.rows_read == len(expected) == 900
    assert set(seen.values()) == {1}
    # Every record read is one of a committed transaction: read them back by offset.
    reader = topic.reader(0)
    try:
        values = _all_values(reader)
    finally:
        reader.close()
    assert sorted(values) == sorted(v for p, v in expected if p == 0)
    offsets = sorted(int(k.split(":")[1]) for k in seen if k.startswith("0:"))
    assert len(offsets) == 450
    assert offsets[-1] - offsets[0] + 1 > 450  # the aborted records' offsets are gaps


def _all_values(reader: ms.inputs.KafkaTopic | Any) -> list[bytes]:
    values: list[bytes] = []
    token, row = b"", 0
    while True:
        result = reader.read(row, row + 1_000, token)
        if result.batch is not None:
            values.extend(result.batch.column("value").to_pylist())
            row += result.batch.num_rows
        token = result.continuation_token
        if result.end_of_input:
            return values


def test_records_deleted_before_the_first_read_are_refused(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = new_topic(kafka_bootstrap, 1)
    fill_keyed(kafka_bootstrap, name, 200, 1)
    delete_records(kafka_bootstrap, name, 0, 60)
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True
    )
    message = _fails(_processor(topic, tmp_path / "state.db"), InputError)
    assert f"topic {name!r} partition 0: records [0, 60) were deleted" in message
    assert "start_offsets={0: 60}" in message


def test_retention_loss_after_a_restart_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    name = new_topic(kafka_bootstrap, 1)
    first = fill_keyed(kafka_bootstrap, name, 500, 1, seed=3)
    state = tmp_path / "state.db"
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True
    )
    LocalRunner(_processor(topic, state)).run(timeout=120)
    assert read_output(_processor(topic, state), "sum") == dict(first)
    fill_keyed(kafka_bootstrap, name, 500, 1, seed=4)
    delete_records(kafka_bootstrap, name, 0, 700)  # 200 records the processor never read
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True
    )
    processor = _processor(topic, state)
    message = _fails(processor, InputError)
    assert f"topic {name!r} partition 0: records [500, 700) were deleted" in message
    assert read_output(processor, "sum") == dict(first)  # nothing of the rest was applied


def test_a_record_that_does_not_decode_is_named(kafka_bootstrap: str, tmp_path: Path) -> None:
    name = new_topic(kafka_bootstrap, 1)
    good = b'{"key": 1, "value": 2}'
    produce(
        kafka_bootstrap, name, [(0, None, good)] * 30 + [(0, None, b"{oops")] + [(0, None, good)]
    )
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True
    )
    message = _fails(_processor(topic, tmp_path / "state.db"), InputError)
    assert f"topic {name!r} partition 0: the record at offset 30 does not decode" in message
    assert "not JSON" in message


def test_a_json_field_of_the_wrong_type_is_named(kafka_bootstrap: str) -> None:
    name = new_topic(kafka_bootstrap, 1)
    produce(
        kafka_bootstrap,
        name,
        [(0, None, b'{"key": 1, "value": 2}'), (0, None, b'{"key": "one", "value": 2}')],
    )
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True
    )
    reader = topic.reader(0)
    try:
        with pytest.raises(InputError, match="the record at offset 1 does not decode"):
            reader.read(0, 10, b"")
    finally:
        reader.close()


AVRO_SCHEMA = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "celsius", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def _avro(datum: dict[str, Any], framing: bool = False) -> bytes:
    out = io.BytesIO()
    if framing:
        out.write(b"\x00\x00\x00\x00\x07")
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMA), datum)
    return out.getvalue()


@pytest.mark.parametrize("framing", [False, True], ids=["bare", "confluent-framing"])
def test_avro_values_decode_and_bad_ones_are_named(kafka_bootstrap: str, framing: bool) -> None:
    name = new_topic(kafka_bootstrap, 1)
    data = [
        {"sensor": "a", "celsius": 21.5, "note": None, "tags": ["x"]},
        {"sensor": "b", "celsius": -3.0, "note": "cold", "tags": []},
    ]
    headers = [("source", b"lab")]
    produce(kafka_bootstrap, name, [(0, b"k", _avro(d, framing)) for d in data], headers=headers)
    produce(kafka_bootstrap, name, [(0, b"k", b"\x00\x01")])
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap,
        name,
        value=ms.inputs.Avro(AVRO_SCHEMA, confluent_framing=framing),
        bounded=True,
    )
    reader = topic.reader(0)
    try:
        batch = reader.read(0, 2, b"").batch
        assert batch is not None
        assert batch.column("value").to_pylist() == data
        assert batch.column("key").to_pylist() == [b"k", b"k"]
        assert batch.column("offset").to_pylist() == [0, 1]
        assert batch.column("partition").to_pylist() == [0, 0]
        assert batch.column("headers").to_pylist() == [[{"key": "source", "value": b"lab"}]] * 2
        assert batch.schema == topic.schema
        with pytest.raises(InputError, match="the record at offset 2 does not decode"):
            reader.read(2, 10, reader.read(0, 2, b"").continuation_token)
    finally:
        reader.close()


def test_partitions_added_to_the_topic_are_refused(kafka_bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    name = new_topic(kafka_bootstrap, 1)
    topic = ms.inputs.KafkaTopic(kafka_bootstrap, name)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_partitions([NewPartitions(name, 2)]).values():
        future.result(30)
    with pytest.raises(ConfigurationError, match="now has 2 partitions, but this processor"):
        topic.reader(0)


def test_configuration_errors(kafka_bootstrap: str) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        ms.inputs.KafkaTopic(kafka_bootstrap, f"missing-{uuid.uuid4().hex}", timeout_seconds=5)
    name = new_topic(kafka_bootstrap, 1)
    with pytest.raises(ConfigurationError, match=r"may not set \['isolation.level'\]"):
        ms.inputs.KafkaTopic(kafka_bootstrap, name, config={"isolation.level": "read_uncommitted"})
    with pytest.raises(ConfigurationError, match="must be a decoder"):
        ms.inputs.KafkaTopic(kafka_bootstrap, name, value="json")  # type: ignore[arg-type]


def test_group_offsets_mirror_the_persisted_position(kafka_bootstrap: str, tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    name = new_topic(kafka_bootstrap, 2)
    fill_keyed(kafka_bootstrap, name, 2_000, 2)
    group = f"g-{uuid.uuid4().hex}"
    topic = ms.inputs.KafkaTopic(
        kafka_bootstrap, name, value=ms.inputs.Json(VALUE_SCHEMA), bounded=True, group_id=group
    )
    LocalRunner(_processor(topic, tmp_path / "state.db")).run(timeout=120)
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(name, p) for p in range(2)], timeout=10)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == list(topic.end_offsets or ())
