"""``millstream status`` of a processor reading a Kafka topic: lag from the partitions' end
offsets against each mapper's persisted next offset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pytest
from millstream.cli import main

from tests.support.jobs import KeyedSumReducer, tuning
from tests.support.kafka_broker import new_topic, produce
from tests.support.kafka_jobs import PackedKeyedSumMapper, fill_keyed


def _status(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["status", *args, "--json"]) == 0
    status: dict[str, Any] = json.loads(capsys.readouterr().out)
    return status


def test_status_lag_is_the_offsets_to_each_partition_end(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = new_topic(kafka_bootstrap, 2)
    fill_keyed(kafka_bootstrap, topic, 6_000, 2, packed=True, seed=9)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    processor = ms.Processor(
        mapper=PackedKeyedSumMapper,
        reducer=KeyedSumReducer,
        input=ms.inputs.KafkaTopic(kafka_bootstrap, topic, bounded=True),
        store=store,
        num_reducers=2,
        tuning=tuning(batch_rows=2_000),
    )
    ms.run_local(processor, timeout=300)
    kafka = ["--kafka-bootstrap", kafka_bootstrap, "--kafka-topic", topic]
    drained = _status(capsys, store, *kafka)
    ends = {m["index"]: m["kafka_end_offset"] for m in drained["mappers"]}
    assert sum(ends.values()) == 6_000
    for mapper in drained["mappers"]:
        assert mapper["kafka_next_offset"] == mapper["kafka_end_offset"]
        assert mapper["lag_rows"] == 0
    more = np.array([1, 1], dtype="<i8").tobytes()
    produce(kafka_bootstrap, topic, [(0, None, more)] * 300 + [(1, None, more)] * 700)
    behind = _status(capsys, store, *kafka)
    assert {m["index"]: m["lag_rows"] for m in behind["mappers"]} == {0: 300, 1: 700}
    assert {m["index"]: m["kafka_next_offset"] for m in behind["mappers"]} == ends
    without = _status(capsys, store)  # no broker given: the lag the mappers published
    assert all("kafka_end_offset" not in m for m in without["mappers"])


def test_status_wants_both_kafka_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", f"sqlite:///{tmp_path / 's.db'}", "--kafka-topic", "t"]) != 0
    assert "--kafka-bootstrap and --kafka-topic" in capsys.readouterr().err
