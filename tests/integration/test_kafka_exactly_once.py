"""Exact sums from a Kafka topic under kill -9 of any worker or of the fork server.

The topic is written in transactions, some aborted: the records' offsets have gaps, so a
mapper that resumed from a row count instead of the next offset would read other records.
The aborted transactions have a producer of their own: noida-db 0.2.3 hides a producer's
committed records from a read_committed fetch that starts after one of its aborted
transactions (``python bench/noida_aborted_index.py``), a broker fault no reader can undo.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from pathlib import Path

import millstream as ms
import numpy as np
import pytest
from millstream.runner.local import LocalRunner

from tests.support.chaos import run_killed
from tests.support.jobs import KeyedSumReducer, read_output, tuning
from tests.support.kafka_broker import BOOTSTRAP_VARIABLE, new_topic, noida_broker, produce
from tests.support.kafka_jobs import PackedKeyedSumMapper, fill_keyed

CHUNKS = 5
CHUNK_ROWS = 12_000


def _fill_with_aborted_transactions(bootstrap: str, topic: str) -> Counter[int]:
    writer, aborter = f"writer-{uuid.uuid4().hex}", f"aborter-{uuid.uuid4().hex}"
    sums: Counter[int] = Counter()
    for chunk in range(CHUNKS):
        sums.update(
            fill_keyed(
                bootstrap, topic, CHUNK_ROWS, 2, packed=True, seed=chunk, transactional_id=writer
            )
        )
        poison = np.array([chunk, 10**9], dtype="<i8").tobytes()
        produce(
            bootstrap,
            topic,
            [(i % 2, None, poison) for i in range(500)],
            transactional_id=aborter,
            abort=True,
        )
    return sums


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
def test_kill_9_reading_a_topic_is_exact(kafka_bootstrap: str, tmp_path: Path, seed: int) -> None:
    name = new_topic(kafka_bootstrap, 2)
    sums = _fill_with_aborted_transactions(kafka_bootstrap, name)
    processor = ms.Processor(
        mapper=PackedKeyedSumMapper,
        reducer=KeyedSumReducer,
        input=ms.inputs.KafkaTopic(kafka_bootstrap, name, bounded=True),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=2,
        config={"map_seconds": 0.04},
        tuning=tuning(
            batch_rows=2_000,
            memory_limit_bytes=40_000,
            commit_interval_seconds=0.1,
            restart=ms.RestartStrategy(max_restarts=1_000),
        ),
    )
    summary, kills = run_killed(processor, seed)
    assert summary.restarts > 0
    assert read_output(processor, "sum") == dict(sums)
    assert summary.rows_read == CHUNKS * CHUNK_ROWS
    print(f"seed {seed}: killed {kills}")


@pytest.mark.slow
@pytest.mark.skipif(
    bool(os.environ.get(BOOTSTRAP_VARIABLE)), reason="restarts a broker of its own (noida-db)"
)
def test_a_broker_restart_while_reading_is_exact(tmp_path: Path) -> None:
    with noida_broker() as broker:
        name = new_topic(broker.bootstrap, 2)
        sums = _fill_with_aborted_transactions(broker.bootstrap, name)
        processor = ms.Processor(
            mapper=PackedKeyedSumMapper,
            reducer=KeyedSumReducer,
            input=ms.inputs.KafkaTopic(broker.bootstrap, name, bounded=True),
            store=f"sqlite:///{tmp_path / 'state.db'}",
            num_reducers=2,
            config={"map_seconds": 0.25},
            tuning=tuning(batch_rows=2_000, restart=ms.RestartStrategy(max_restarts=1_000)),
        )
        runner = LocalRunner(processor)
        runner.start()
        while not read_output(processor, "sum"):  # stop the broker with work under way
            time.sleep(0.05)
        assert runner.pids()
        broker.stop()
        time.sleep(1.0)
        broker.start()
        summary = runner.wait(timeout=300)
    assert read_output(processor, "sum") == dict(sums)
    assert summary.rows_read == CHUNKS * CHUNK_ROWS
