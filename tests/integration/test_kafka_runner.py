"""The local runner publishes a processor's Kafka sinks: a publisher per queue partition,
restarted when it dies, the run ending once the processor drained and every row is in a
committed Kafka transaction."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import millstream as ms
import numpy as np
import pytest
from millstream.runner.local import LocalRunner

from tests.support.jobs import tuning
from tests.support.kafka_broker import committed_values, new_topic
from tests.support.kafka_jobs import PackedKeyedSumMapper, SumsToKafkaQueueReducer, fill_keyed


def _sums_in_topic(bootstrap: str, topic: str) -> dict[int, int]:
    got: Counter[int] = Counter()
    for value, count in committed_values(bootstrap, topic).items():
        key, total = np.frombuffer(value, dtype="<i8").tolist()
        got[key] += total * count
    return {k: v for k, v in got.items() if v}


def _processor(bootstrap: str, source: str, sink: str, store: str) -> ms.Processor:
    return ms.Processor(
        mapper=PackedKeyedSumMapper,
        reducer=SumsToKafkaQueueReducer,
        input=ms.inputs.KafkaTopic(bootstrap, source, bounded=True),
        store=store,
        num_reducers=2,
        outputs=[ms.outputs.KafkaSink(store, "out", 2, ms.outputs.KafkaTarget(bootstrap, sink))],
        config={"map_seconds": 0.04, "queue": "out"},
        tuning=tuning(
            batch_rows=2_000,
            commit_interval_seconds=0.1,
            restart=ms.RestartStrategy(max_restarts=1_000),
        ),
    )


def test_run_local_publishes_a_kafka_sink(kafka_bootstrap: str, tmp_path: Path) -> None:
    source, sink = new_topic(kafka_bootstrap, 2), new_topic(kafka_bootstrap, 2)
    sums = fill_keyed(kafka_bootstrap, source, 20_000, 2, packed=True, seed=7)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    summary = ms.run_local(_processor(kafka_bootstrap, source, sink, store), timeout=300)
    assert summary.rows_read == 20_000
    assert _sums_in_topic(kafka_bootstrap, sink) == {k: v for k, v in sums.items() if v}


@pytest.mark.slow
def test_killed_publishers_are_restarted_every_row_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    source, sink = new_topic(kafka_bootstrap, 2), new_topic(kafka_bootstrap, 2)
    sums = fill_keyed(kafka_bootstrap, source, 30_000, 2, packed=True, seed=8)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    runner = LocalRunner(_processor(kafka_bootstrap, source, sink, store))
    runner.start()
    assert runner.publishers is not None
    rng = random.Random(4)
    kills = 0  # the first one before the queue is sealed: a publisher at work
    try:
        while not runner.poll():
            live = runner.publishers.pids()
            if live and (kills == 0 or (kills < 4 and rng.random() < 0.05)):
                os.kill(rng.choice(sorted(live.values())), signal.SIGKILL)
                kills += 1
            time.sleep(0.05)
        summary = runner.finish()
    finally:
        runner.stop()
    assert kills > 0
    assert runner.publishers.restarts > 0
    assert summary.rows_read == 30_000
    assert _sums_in_topic(kafka_bootstrap, sink) == {k: v for k, v in sums.items() if v}
