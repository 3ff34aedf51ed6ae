"""A store queue published to a Kafka topic: each row once for read_committed consumers,
under kill -9 of the publisher and with a zombie publisher fenced."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import millstream as ms
import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import KafkaException
from millstream.outputs.kafka_sink import KafkaPublisher, KafkaTarget, PublisherError

from tests.support.kafka_broker import BOOTSTRAP_VARIABLE, committed_values, new_topic, noida_broker

ROOT = Path(__file__).resolve().parent.parent.parent


def _fill_queue(state: Path, name: str, rows: int, partitions: int = 2) -> ms.inputs.StoreQueue:
    queue = ms.inputs.StoreQueue(f"sqlite:///{state}", name, partitions)
    for p in range(partitions):
        for start in range(0, rows, 1_000):
            values = [f"{p}-{i}".encode() for i in range(start, min(rows, start + 1_000))]
            queue.append(p, pa.record_batch({"key": [v[:3] for v in values], "value": values}))
        queue.close_partition(p)
    return queue


@pytest.fixture
def publishers() -> Iterator[dict[int, subprocess.Popen[bytes]]]:
    """The publisher processes of a test, by queue partition; killed if left running."""
    running: dict[int, subprocess.Popen[bytes]] = {}
    yield running
    for process in running.values():
        if process.poll() is None:
            process.kill()
        process.wait()


def _expected(rows: int, partitions: int = 2) -> Counter[bytes]:
    return Counter(f"{p}-{i}".encode() for p in range(partitions) for i in range(rows))


def test_zombie_publisher_is_fenced(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = new_topic(kafka_bootstrap, 2)
    queue = _fill_queue(tmp_path / "state.db", "out", 3_000, partitions=1)
    target = KafkaTarget(kafka_bootstrap, topic)
    zombie = KafkaPublisher(queue, 0, target)
    assert zombie.publish_once(max_rows=1_000) == 1_000
    successor = KafkaPublisher(queue, 0, target)  # fences the zombie
    assert successor.next_row == 1_000
    with pytest.raises(KafkaException):
        zombie.publish_once(max_rows=1_000)
    assert successor.run() == 2_000
    zombie.close()
    successor.close()
    assert committed_values(kafka_bootstrap, topic) == _expected(3_000, partitions=1)


PUBLISHER = """
import sys
import time
import millstream as ms
from millstream.outputs.kafka_sink import KafkaPublisher, KafkaTarget
state, name, partition, bootstrap, topic, *timeout = sys.argv[1:]
queue = ms.inputs.StoreQueue(f"sqlite:///{state}", name, 2)
trim = queue.trim
def slow_trim(partition, row):  # a long gap between a Kafka commit and the queue's trim
    time.sleep(0.2)
    trim(partition, row)
queue.trim = slow_trim
timeout_seconds = float(timeout[0]) if timeout else 60.0
target = KafkaTarget(bootstrap, topic, transaction_timeout_seconds=timeout_seconds)
publisher = KafkaPublisher(queue, int(partition), target)
publisher.run(rows_per_transaction=2_000)
publisher.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_publishers_every_row_once(
    kafka_bootstrap: str, tmp_path: Path, seed: int, publishers: dict[int, subprocess.Popen[bytes]]
) -> None:
    topic = new_topic(kafka_bootstrap, 3)
    rows = 30_000
    _fill_queue(tmp_path / "state.db", "out", rows)
    rng = random.Random(seed)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT)])}

    def start(partition: int) -> subprocess.Popen[bytes]:
        args = [str(tmp_path / "state.db"), "out", str(partition), kafka_bootstrap, topic]
        return subprocess.Popen([sys.executable, "-c", PUBLISHER, *args], env=env)

    publishers.update({p: start(p) for p in range(2)})
    kills = 0
    deadline = time.monotonic() + 180
    while publishers and time.monotonic() < deadline:
        time.sleep(rng.uniform(1.0, 2.0))  # a publisher takes about a second to start
        for p, process in list(publishers.items()):
            if process.poll() is not None:
                assert process.returncode == 0
                del publishers[p]
        if publishers and kills < 6:
            p = rng.choice(sorted(publishers))
            os.kill(publishers[p].pid, signal.SIGKILL)
            publishers[p].wait()
            kills += 1
            publishers[p] = start(p)
    assert not publishers, "the publishers did not finish"
    assert kills > 0
    assert committed_values(kafka_bootstrap, topic) == _expected(rows)


@pytest.mark.slow
def test_kafka_to_kafka_under_kill_9(
    kafka_bootstrap: str, tmp_path: Path, publishers: dict[int, subprocess.Popen[bytes]]
) -> None:
    from millstream.runner.local import LocalRunner

    from tests.support.chaos import RandomKiller
    from tests.support.jobs import tuning
    from tests.support.kafka_jobs import PackedKeyedSumMapper, SumsToKafkaQueueReducer, fill_keyed

    source = new_topic(kafka_bootstrap, 2)
    sink = new_topic(kafka_bootstrap, 2)
    sums = fill_keyed(kafka_bootstrap, source, 40_000, 2, packed=True, seed=5)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    queue = ms.inputs.StoreQueue(store, "out", 2)
    processor = ms.Processor(
        mapper=PackedKeyedSumMapper,
        reducer=SumsToKafkaQueueReducer,
        input=ms.inputs.KafkaTopic(kafka_bootstrap, source, bounded=True),
        store=store,
        num_reducers=2,
        outputs=[queue],
        config={"map_seconds": 0.04, "queue": "out"},
        tuning=tuning(
            batch_rows=2_000,
            memory_limit_bytes=40_000,
            commit_interval_seconds=0.1,
            restart=ms.RestartStrategy(max_restarts=1_000),
        ),
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT)])}

    def start(partition: int) -> subprocess.Popen[bytes]:
        args = [str(tmp_path / "state.db"), "out", str(partition), kafka_bootstrap, sink]
        return subprocess.Popen([sys.executable, "-c", PUBLISHER, *args], env=env)

    publishers.update({p: start(p) for p in range(2)})
    rng = random.Random(3)
    runner = LocalRunner(processor)
    runner.start()
    with RandomKiller(runner, 3) as killer:
        kills = 0
        while runner.pids() and kills < 10:
            time.sleep(rng.uniform(0.2, 1.0))
            p = rng.randrange(2)
            if publishers[p].poll() is None:
                os.kill(publishers[p].pid, signal.SIGKILL)
                publishers[p].wait()
                kills += 1
            publishers[p] = start(p)
        summary = runner.wait(timeout=300)
    assert killer.kills
    assert summary.rows_read == 40_000
    for p in range(2):  # the last instances finish the sealed queue
        assert publishers[p].wait(timeout=120) == 0
    got: Counter[int] = Counter()
    for value, count in committed_values(kafka_bootstrap, sink).items():
        key, total = np.frombuffer(value, dtype="<i8").tolist()
        got[key] += total * count
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in sums.items() if v}


@pytest.mark.slow
@pytest.mark.skipif(
    bool(os.environ.get(BOOTSTRAP_VARIABLE)), reason="restarts a broker of its own (noida-db)"
)
def test_a_broker_restart_under_publishers_ends_or_fails_them(
    tmp_path: Path, publishers: dict[int, subprocess.Popen[bytes]]
) -> None:
    """The broker stopped and started under two publisher processes and one in a thread:
    each goes on or ends with a PublisherError (none hangs, none fails otherwise), one
    started in its place finishes the partition, and no row is visible twice to a
    read_committed consumer.

    That every row is visible is not checked: noida-db 0.2.3 never ends a transaction used
    across its restart, so its partitions' last stable offset sticks there and hides what
    follows (``bench/noida_restart_hangs_transaction.py`` shows it with confluent-kafka
    alone); on Kafka, ``init_transactions`` of the publisher started in its place aborts it.
    """
    rows = 30_000
    queue = _fill_queue(tmp_path / "state.db", "out", rows)
    in_thread = _fill_queue(tmp_path / "state.db", "thread", 10_000, partitions=1)
    outcome: list[BaseException | int] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT)])}
    logs: list[Path] = []
    with noida_broker() as broker:
        topic = new_topic(broker.bootstrap, 3)

        def start(partition: int) -> subprocess.Popen[bytes]:
            logs.append(tmp_path / f"publisher-{len(logs)}.log")
            args = [str(tmp_path / "state.db"), "out", str(partition), broker.bootstrap, topic]
            with logs[-1].open("wb") as log:
                command = [sys.executable, "-c", PUBLISHER, *args, "10"]
                return subprocess.Popen(command, env=env, stderr=log)

        publishers.update({p: start(p) for p in range(2)})
        thread_topic = new_topic(broker.bootstrap, 1)
        target = KafkaTarget(broker.bootstrap, thread_topic, transaction_timeout_seconds=10)

        def publish() -> None:
            try:
                outcome.append(KafkaPublisher(in_thread, 0, target).run(rows_per_transaction=500))
            except BaseException as exc:  # checked below
                outcome.append(exc)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        while min(queue.first_row_index(0), queue.first_row_index(1)) == 0 or (
            in_thread.first_row_index(0) == 0 and thread.is_alive()
        ):
            time.sleep(0.05)  # all publishing: some transactions committed
        broker.stop()
        time.sleep(1.0)
        broker.start()
        thread.join(timeout=120)
        assert not thread.is_alive(), "the publisher in a thread hangs"
        assert isinstance(outcome[0], int | PublisherError), repr(outcome[0])
        in_thread_got = committed_values(broker.bootstrap, thread_topic)
        for p in range(2):
            for _ in range(3):
                if publishers[p].wait(timeout=120) == 0:  # a hanging one fails here
                    break
                publishers[p] = start(p)  # ended loudly: a supervisor starts another
            assert publishers[p].returncode == 0
        got = committed_values(broker.bootstrap, topic)
    failures = [path.read_text(errors="replace") for path in logs]
    assert all("Traceback" not in text or "PublisherError" in text for text in failures)
    assert set(got) <= set(_expected(rows))
    assert max(got.values()) == 1, "a row reached read_committed consumers twice"
    assert queue.first_row_index(0) == queue.first_row_index(1) == rows
    assert max(in_thread_got.values(), default=1) == 1
    assert set(in_thread_got) <= set(_expected(10_000, partitions=1))
