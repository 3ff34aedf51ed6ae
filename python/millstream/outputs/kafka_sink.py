"""Publishing a store queue's rows to a Kafka topic, exactly once for ``read_committed``
consumers.

Reducers append their output rows to a :class:`~millstream.inputs.StoreQueue` in their own
commit (``txn.append``): each row lands in the queue once, numbered by its row index. A
:class:`KafkaPublisher` per queue partition then moves the rows to Kafka in Kafka
transactions, and ties the position to the records in the same transaction:

- Its producer's ``transactional.id`` is fixed per (queue, partition). Starting a producer
  with it (``init_transactions``) fences every earlier instance: a zombie's later sends and
  commit fail, and the transaction it left open is aborted, so its records stay invisible
  to ``read_committed`` consumers.
- Each transaction publishes queue rows ``[b, e)`` and, with ``send_offsets_to_transaction``,
  records ``e`` as the committed offset of the publisher's own consumer group (on the
  output topic's partition 0: only the number matters). The records and ``e`` commit
  together or not at all.
- A publisher (re)starting reads that committed offset, ``b``, after fencing: it is exactly
  how far the last committed transaction published, so it publishes from row ``b`` on.
  Rows before ``b`` are trimmed from the queue, never before their transaction committed.

So every queue row is in exactly one committed transaction, and the processor's commit is
what put it in the queue: each output row reaches ``read_committed`` consumers once,
whichever process is killed when, and across a broker restart (a transaction whose commit
is in doubt is committed or aborted by the broker before the next ``init_transactions``
returns).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from millstream.exceptions import ConfigurationError, InputError
from millstream.inputs.store_queue import StoreQueue

log = logging.getLogger(__name__)

PUBLISH_ROWS = 10_000
"""Queue rows per Kafka transaction at most."""

FIXED_SETTINGS = ("transactional.id", "enable.idempotence", "bootstrap.servers")


def _kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError as exc:
        raise ConfigurationError(
            "KafkaPublisher needs confluent-kafka: pip install 'millstream[kafka]'"
        ) from exc
    return confluent_kafka


@dataclass(frozen=True)
class KafkaTarget:
    """Where a publisher writes: a topic, and how rows become records.

    Rows need a ``value`` column (binary or string) and may have a ``key`` column (binary
    or string) and an int ``partition`` column; without one, a record goes to the partition
    of its key (librdkafka's partitioner) or, without a key, to the queue partition's
    number modulo the topic's partitions.

    Args:
        bootstrap_servers: The brokers.
        topic: The output topic (it must exist).
        config: More librdkafka producer settings (security, client id, batching).
        transaction_timeout_seconds: How long a transaction may stay open; a publisher
            killed with one open leaves it until its next instance starts, or this long.
    """

    bootstrap_servers: str
    topic: str
    config: Mapping[str, Any] = field(default_factory=dict)
    transaction_timeout_seconds: float = 60.0

    def __post_init__(self) -> None:
        fixed = sorted(set(self.config) & set(FIXED_SETTINGS))
        if fixed:
            raise ConfigurationError(f"KafkaTarget config may not set {fixed}")


class KafkaPublisher:
    """Publishes partition ``partition`` of ``queue`` to ``target``, exactly once.

    One live publisher per (queue, partition) does the work; a second one fences the
    first (which then raises on its next transaction). Run :meth:`run` until the queue
    partition is sealed and published, or call :meth:`publish_once` in a loop of your own.
    """

    def __init__(self, queue: StoreQueue, partition: int, target: KafkaTarget) -> None:
        if not 0 <= partition < queue.num_partitions:
            raise ConfigurationError(
                f"partition {partition} out of range: queue {queue.name!r} has "
                f"{queue.num_partitions} partitions"
            )
        self._kafka = _kafka()
        self.queue = queue
        self.partition = partition
        self.target = target
        self.transactional_id = f"millstream-{queue.name}-{partition}"
        """The producer's id, which fences earlier instances."""
        self.group_id = f"millstream-publisher-{queue.name}-{partition}"
        """The consumer group whose committed offset is the next queue row to publish."""
        self._anchor = self._kafka.TopicPartition(target.topic, 0)
        self._consumer = self._kafka.Consumer(
            {
                "bootstrap.servers": target.bootstrap_servers,
                "group.id": self.group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self._num_topic_partitions = self._topic_partitions()
        self._producer = self._kafka.Producer(
            {
                **target.config,
                "bootstrap.servers": target.bootstrap_servers,
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": int(target.transaction_timeout_seconds * 1000),
            }
        )
        self._producer.init_transactions(target.transaction_timeout_seconds)
        self.next_row = self._published_through()
        """The next queue row to publish (all before it are in committed transactions)."""
        self.rows_published = 0

    def _topic_partitions(self) -> int:
        metadata = self._consumer.list_topics(self.target.topic, timeout=10)
        found = metadata.topics.get(self.target.topic)
        if found is None or found.error is not None or not found.partitions:
            raise ConfigurationError(
                f"output topic {self.target.topic!r} does not exist on "
                f"{self.target.bootstrap_servers}; create it first"
            )
        return len(found.partitions)

    def _published_through(self) -> int:
        """What the last committed transaction published through (its recorded offset)."""
        (committed,) = self._consumer.committed([self._anchor], timeout=30)
        if committed.error is not None:
            raise InputError(f"cannot read the publisher's position: {committed.error}")
        offset = int(committed.offset)
        if offset < 0:  # nothing committed yet
            offset = 0
        first = self.queue.first_row_index(self.partition)
        if offset < first:
            raise InputError(
                f"queue {self.queue.name!r} partition {self.partition}: rows from {offset} "
                f"were to be published to {self.target.topic!r}, but the queue was trimmed to "
                f"{first}; another publisher (a group other than {self.group_id!r}?) trimmed it"
            )
        return offset

    def publish_once(self, max_rows: int = PUBLISH_ROWS) -> int:
        """Publish the rows waiting in the queue (up to ``max_rows``) in one transaction.

        Returns:
            The rows published (0: none waiting).

        Raises:
            confluent_kafka.KafkaException: The transaction failed; a fenced producer (a
                newer instance runs) cannot go on: stop this one.
        """
        result = self.queue.read(self.partition, self.next_row, max_rows)
        batch = result.batch
        if batch is None or batch.num_rows == 0:
            return 0
        end = self.next_row + batch.num_rows
        self._producer.begin_transaction()
        try:
            self._produce(batch)
            self._producer.send_offsets_to_transaction(
                [self._kafka.TopicPartition(self.target.topic, 0, end)],
                self._consumer.consumer_group_metadata(),
                self.target.transaction_timeout_seconds,
            )
            self._producer.commit_transaction(self.target.transaction_timeout_seconds)
        except self._kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if error is not None and error.txn_requires_abort():
                self._producer.abort_transaction(self.target.transaction_timeout_seconds)
            raise
        self.next_row = end
        self.rows_published += batch.num_rows
        self.queue.trim(self.partition, end)
        return int(batch.num_rows)

    def _produce(self, batch: pa.RecordBatch) -> None:
        names = batch.schema.names
        if "value" not in names:
            raise ConfigurationError(
                f"rows published to Kafka need a 'value' column (binary or string); "
                f"queue {self.queue.name!r} has {names}"
            )
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in names else [None] * len(values)
        if "partition" in names:
            partitions = batch.column("partition").to_pylist()
        elif "key" in names:
            partitions = [-1] * len(values)  # librdkafka's partitioner, by key
        else:
            partitions = [self.partition % self._num_topic_partitions] * len(values)
        topic = self.target.topic
        for key, value, partition in zip(keys, values, partitions, strict=True):
            while True:
                try:
                    self._producer.produce(topic, value=value, key=key, partition=partition)
                    break
                except BufferError:
                    self._producer.poll(0.05)

    def run(
        self,
        stop: threading.Event | None = None,
        idle_seconds: float = 0.05,
        rows_per_transaction: int = PUBLISH_ROWS,
    ) -> int:
        """Publish until the queue partition is sealed and every row published, or
        ``stop`` is set. Returns the rows this instance published."""
        stop = stop or threading.Event()
        while not stop.is_set():
            if self.publish_once(rows_per_transaction):
                continue
            if self.queue.is_sealed(self.partition) and self.next_row >= self.queue.end_row_index(
                self.partition
            ):
                break
            self.queue.wait_for_rows(self.partition, self.next_row, idle_seconds)
        return self.rows_published

    def close(self) -> None:
        """Release the producer and the consumer (an open transaction is left to be
        aborted by the next instance, or by its timeout)."""
        try:
            self._producer.flush(1)
        except self._kafka.KafkaException as exc:  # fenced: nothing of it can land
            log.info("publisher %s: %s", self.transactional_id, exc)
        self._consumer.close()


__all__ = ["KafkaPublisher", "KafkaTarget"]
