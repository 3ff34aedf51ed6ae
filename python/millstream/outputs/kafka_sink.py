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

A broker restart breaks a producer in ways librdkafka does not always report: after one,
``send_offsets_to_transaction`` can wait forever whatever its timeout (librdkafka issues
5456 and 5511: the group coordinator it cached is gone), and a producer can fail with a
fatal ``OUT_OF_ORDER_SEQUENCE_NUMBER``. So every producer call here runs under a deadline of
our own. :meth:`KafkaPublisher.run` answers a failed transaction by starting a new producer
with the same ``transactional.id`` (which aborts the transaction left open, or settles one
whose commit is in doubt), re-reading the committed position and going on; it gives up with
:class:`PublisherError` after ``max_failures`` failures in a row, at once when a newer
publisher fenced it, and at once when a producer call outlived its deadline: a producer
stuck in librdkafka cannot be closed, so only the end of its process stops it (the local
runner then starts a new publisher process; see :mod:`millstream.runner.publishers`).

On noida-db 0.2.3 (the test broker), a transaction in use across the broker's restart is
never ended, neither by the next ``init_transactions`` nor by its timeout: the partitions'
last stable offset sticks there and ``read_committed`` consumers see nothing committed
after it. That is the broker's fault (``bench/noida_restart_hangs_transaction.py`` shows
it with confluent-kafka alone); a publisher goes on or fails loudly, never publishing a
row twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from millstream.exceptions import ConfigurationError, InputError, MillstreamError
from millstream.inputs.store_queue import StoreQueue

log = logging.getLogger(__name__)

PUBLISH_ROWS = 10_000
"""Queue rows per Kafka transaction at most."""

FIXED_SETTINGS = ("transactional.id", "enable.idempotence", "bootstrap.servers")

CALL_GRACE_SECONDS = 5.0
"""How long past its own timeout a producer call may take before the publisher drops it."""

MAX_FAILURES = 10
"""Failed transactions in a row after which :meth:`KafkaPublisher.run` gives up."""


class PublisherError(MillstreamError):
    """A publisher cannot go on: a newer instance fenced it, the brokers failed its
    transactions too many times in a row, or a producer call outlived its deadline (the
    cause is its ``__cause__``)."""


class PublisherStalledError(MillstreamError):
    """A producer call outlived its deadline; the producer was dropped."""


def _call_with_deadline(name: str, seconds: float, call: Any, *args: Any) -> Any:
    """``call(*args)`` in a thread of its own; raise :class:`PublisherStalledError` if it
    has not returned after ``seconds`` (the thread is left to finish or hang alone)."""
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call(*args)
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    if not done.wait(seconds):
        raise PublisherStalledError(f"{name} did not return within {seconds:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


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
        self._producer = self._new_producer()
        self.next_row = self._published_through()
        """The next queue row to publish (all before it are in committed transactions)."""
        self.rows_published = 0
        self.producer_restarts = 0
        """How many times :meth:`restart_producer` replaced the producer."""

    def _bounded(self, what: str, call: Any, *args: Any) -> Any:
        """A producer call under the publisher's deadline (its timeout plus a grace)."""
        seconds = self.target.transaction_timeout_seconds + CALL_GRACE_SECONDS
        return _call_with_deadline(f"{self.transactional_id} {what}", seconds, call, *args)

    def _new_producer(self) -> Any:
        """A producer with the publisher's ``transactional.id``, its transactions
        initialised (which fences earlier instances and settles their open transaction)."""
        producer = self._kafka.Producer(
            {
                **self.target.config,
                "bootstrap.servers": self.target.bootstrap_servers,
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": int(self.target.transaction_timeout_seconds * 1000),
            }
        )
        self._bounded(
            "init_transactions", producer.init_transactions, self.target.transaction_timeout_seconds
        )
        return producer

    def _drop_producer(self) -> None:
        """Forget the producer after purging what it has not delivered, so that it sends
        nothing after its successor's ``init_transactions`` (a call of it may still hang in
        its own thread)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.purge()
            except (self._kafka.KafkaException, RuntimeError) as exc:
                log.info("publisher %s: purge: %s", self.transactional_id, exc)

    def restart_producer(self) -> None:
        """Drop the producer, start a new one with the same ``transactional.id`` and
        re-read how far the committed transactions published.

        What the dropped producer had open is aborted (or, if its commit was in doubt,
        settled) before the new one's ``init_transactions`` returns, so the position read
        after it is exact. Raises what the brokers raise while they are unreachable.
        """
        self._drop_producer()
        self._producer = self._new_producer()
        self.next_row = self._published_through()
        self.producer_restarts += 1

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
        if self._producer is None:
            raise PublisherError(f"publisher {self.transactional_id}: restart_producer() first")
        end = self.next_row + batch.num_rows
        producer = self._producer
        timeout = self.target.transaction_timeout_seconds
        producer.begin_transaction()
        try:
            self._produce(batch)
            self._bounded(
                "send_offsets_to_transaction",
                producer.send_offsets_to_transaction,
                [self._kafka.TopicPartition(self.target.topic, 0, end)],
                self._consumer.consumer_group_metadata(),
                timeout,
            )
            self._bounded("commit_transaction", producer.commit_transaction, timeout)
        except PublisherStalledError:
            self._drop_producer()
            raise
        except self._kafka.KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if error is not None and error.txn_requires_abort():
                self._bounded("abort_transaction", producer.abort_transaction, timeout)
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
        producer = self._producer
        for key, value, partition in zip(keys, values, partitions, strict=True):
            deadline = time.monotonic() + self.target.transaction_timeout_seconds
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=partition)
                    break
                except BufferError:
                    if time.monotonic() > deadline:  # nothing delivered: brokers away
                        self._drop_producer()
                        raise PublisherStalledError(
                            f"{self.transactional_id}: the producer's queue stayed full for "
                            f"{self.target.transaction_timeout_seconds:.0f} s"
                        ) from None
                    producer.poll(0.05)

    def _fenced(self, exc: BaseException) -> bool:
        error = exc.args[0] if isinstance(exc, self._kafka.KafkaException) and exc.args else None
        codes = (
            self._kafka.KafkaError._FENCED,
            self._kafka.KafkaError.PRODUCER_FENCED,
            self._kafka.KafkaError.INVALID_PRODUCER_EPOCH,
        )
        return error is not None and error.code() in codes

    def run(
        self,
        stop: threading.Event | None = None,
        idle_seconds: float = 0.05,
        rows_per_transaction: int = PUBLISH_ROWS,
        max_failures: int = MAX_FAILURES,
    ) -> int:
        """Publish until the queue partition is sealed and every row published, or
        ``stop`` is set. Returns the rows this instance published.

        A failed transaction (brokers restarting or unreachable) restarts the producer
        (:meth:`restart_producer`) after a pause, and publishing goes on from the
        committed position.

        Raises:
            PublisherError: A newer publisher fenced this one, ``max_failures``
                transactions or producer restarts in a row failed, or a producer call
                outlived its deadline (end the process: the producer cannot be closed).
        """
        stop = stop or threading.Event()
        failures = 0
        while not stop.is_set():
            try:
                if self._producer is None:
                    self.restart_producer()
                published = self.publish_once(rows_per_transaction)
            except PublisherStalledError as exc:
                raise PublisherError(
                    f"publisher {self.transactional_id}: {exc}; end this process (a producer "
                    "stuck in librdkafka cannot be closed) and start a new publisher"
                ) from exc
            except self._kafka.KafkaException as exc:
                if self._fenced(exc):
                    raise PublisherError(
                        f"publisher {self.transactional_id} was fenced: a newer instance "
                        "publishes this queue partition"
                    ) from exc
                failures += 1
                if failures >= max_failures:
                    raise PublisherError(
                        f"publisher {self.transactional_id}: {failures} transactions in a row "
                        f"failed, the last with {exc}; are the brokers "
                        f"{self.target.bootstrap_servers} up?"
                    ) from exc
                log.warning("publisher %s: %s; restarting its producer", self.transactional_id, exc)
                self._drop_producer()
                stop.wait(min(5.0, 0.5 * failures))
                continue
            failures = 0
            if published:
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
            if self._producer is not None:
                self._producer.flush(1)
        except self._kafka.KafkaException as exc:  # fenced: nothing of it can land
            log.info("publisher %s: %s", self.transactional_id, exc)
        self._consumer.close()


class KafkaSink(StoreQueue):
    """A store queue whose rows a runner publishes to a Kafka topic, exactly once.

    Declared in a processor's ``outputs``, it is a :class:`StoreQueue` to the reducers
    (``txn.append(name, rows)``, rows as :class:`KafkaTarget` describes), and the local
    runner runs a :class:`KafkaPublisher` per partition beside the workers: it restarts one
    that dies, and the run ends once the processor drained and every row is published.

    Args:
        store: Store URL of the processor.
        name: Queue name, unique within the store.
        num_partitions: Queue partitions (one publisher each); usually the reducers' count.
        target: The topic and how to reach it.
    """

    def __init__(self, store: str, name: str, num_partitions: int, target: KafkaTarget) -> None:
        if not isinstance(target, KafkaTarget):
            raise ConfigurationError(
                f"KafkaSink {name!r}: target must be a millstream.outputs.KafkaTarget, "
                f"got {target!r}"
            )
        super().__init__(store, name, num_partitions)
        self.target = target


__all__ = [
    "KafkaPublisher",
    "KafkaSink",
    "KafkaTarget",
    "PublisherError",
    "PublisherStalledError",
]
