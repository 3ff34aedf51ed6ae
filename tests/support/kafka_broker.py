"""A Kafka-protocol broker for the tests: ``MILLSTREAM_KAFKA_BOOTSTRAP`` if set (a real
Kafka), else a ``noida-db`` broker started on a free loopback port in a temporary directory
and stopped, with everything it wrote, at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BOOTSTRAP_VARIABLE = "MILLSTREAM_KAFKA_BOOTSTRAP"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _noida() -> str:
    found = Path(sys.executable).parent / "noida-db"
    if found.exists():
        return str(found)
    path = shutil.which("noida-db")
    if path is None:
        raise RuntimeError(
            f"no Kafka broker: install noida-db (pip install noida-db) or set {BOOTSTRAP_VARIABLE}"
        )
    return path


class NoidaBroker:
    """A noida-db Kafka broker on a free loopback port, its data in a temporary directory;
    :meth:`stop` and :meth:`start` restart it on the same port with the same data."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="millstream-kafka-"))
        self.port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log = (self.directory / "broker.log").open("ab")

    def start(self, timeout: float = 30.0) -> None:
        """Start the broker; return once it accepts connections."""
        data = str(self.directory / "data")
        command = ["start", "--only", "kafka", "--kafka-port", str(self.port), "--data-dir", data]
        self._process = subprocess.Popen(
            [_noida(), *command], stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                log = (self.directory / "broker.log").read_text(errors="replace")
                raise RuntimeError(
                    f"noida-db exited with {self._process.returncode}: {log[-2000:]}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"noida-db did not listen on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the broker as Ctrl-C does (it saves its data), killing it if it hangs."""
        process, self._process = self._process, None
        if process is None:
            return
        for sig in (signal.SIGINT, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        process.wait()

    def close(self) -> None:
        """Stop the broker and delete its data."""
        self.stop()
        self._log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextmanager
def noida_broker() -> Iterator[NoidaBroker]:
    """A started :class:`NoidaBroker`, stopped and deleted after."""
    broker = NoidaBroker()
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


def new_topic(bootstrap: str, partitions: int, prefix: str = "t") -> str:
    """Create a topic with a fresh name; returns the name."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    return name


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[int, bytes | None, bytes | None]],
    *,
    transactional_id: str | None = None,
    abort: bool = False,
    headers: Any = None,
) -> None:
    """Produce ``(partition, key, value)`` records and wait until they are acknowledged;
    with ``transactional_id``, in one transaction (aborted if ``abort``)."""
    from confluent_kafka import Producer

    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "linger.ms": 5,
    }
    if transactional_id is not None:
        settings["transactional.id"] = transactional_id
    producer = Producer(settings)
    if transactional_id is not None:
        producer.init_transactions(30)
        producer.begin_transaction()
    for partition, key, value in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
    if transactional_id is None:
        left = producer.flush(60)
        assert left == 0, f"{left} records not acknowledged"
    elif abort:
        producer.flush(60)
        producer.abort_transaction(30)
    else:
        producer.commit_transaction(60)


def delete_records(bootstrap: str, topic: str, partition: int, before: int) -> None:
    """Delete the records of a partition below offset ``before`` (what retention does)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result(30)


@contextmanager
def kafka_bootstrap_address() -> Iterator[str]:
    """The bootstrap address of the broker the tests use (see the module docstring)."""
    given = os.environ.get(BOOTSTRAP_VARIABLE)
    if given:
        yield given
        return
    with noida_broker() as broker:
        yield broker.bootstrap


def committed_values(bootstrap: str, topic: str) -> Counter[bytes]:
    """Every record a read_committed consumer sees in ``topic``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "check",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    metadata = consumer.list_topics(topic, timeout=10)
    partitions = list(metadata.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen: Counter[bytes] = Counter()
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    while len(ended) < len(partitions) and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 0.2):
            error = message.error()
            if error is None:
                seen[message.value()] += 1
            elif error.code() == KafkaError._PARTITION_EOF:
                ended.add(message.partition())
    consumer.close()
    return seen
