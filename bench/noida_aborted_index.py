"""noida-db 0.2.3: a read_committed fetch that starts after an aborted transaction of a
producer skips that producer's committed records from there on.

One transactional producer writes committed transactions with an aborted one after each.
A read_committed consumer assigned at offset 0 gets every committed record; assigned at the
first committed record after an aborted transaction, it gets none and reaches the end. A
Kafka broker lists in a fetch response only the aborted transactions that overlap the
fetched offsets; the client skips a producer's batches from the first offset of each listed
transaction until that transaction's abort marker, so listing an earlier aborted transaction
hides later committed ones. With the aborted transactions written by another
``transactional.id`` (``--two-producers``) every start offset gets every committed record.

Any consumer that resumes from an offset (millstream's readers do after every restart) loses
records this way: the suite writes aborted transactions with a producer of their own.

Run: python noida_aborted_index.py [--two-producers]
"""

import os
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # the repository root
from tests.support.kafka_broker import new_topic, noida_broker

TWO_PRODUCERS = "--two-producers" in sys.argv
ROUNDS = 3
RECORDS = 100


def write(bootstrap: str, topic: str, transactional_id: str, value: bytes, abort: bool) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    for _ in range(RECORDS):
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0  # the records reach the broker, aborted or not
    if abort:
        producer.abort_transaction(30)
    else:
        producer.commit_transaction(30)


def committed_from(bootstrap: str, topic: str, offset: int) -> list[int]:
    """The offsets a read_committed consumer gets from ``offset`` to the partition's end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "probe",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, offset)])
    got: list[int] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            if message.error() is not None:
                consumer.close()
                return got
            got.append(message.offset())
    consumer.close()
    raise RuntimeError("no end of partition within 20 s")


with noida_broker() as broker:
    topic = new_topic(broker.bootstrap, 1)
    writer = f"w-{uuid.uuid4().hex}"
    aborter = f"a-{uuid.uuid4().hex}" if TWO_PRODUCERS else writer
    for _ in range(ROUNDS):
        write(broker.bootstrap, topic, writer, b"committed", abort=False)
        write(broker.bootstrap, topic, aborter, b"aborted", abort=True)
    everything = committed_from(broker.bootstrap, topic, 0)
    print(f"from offset 0: {len(everything)} committed records")
    for start in everything[::RECORDS][1:]:
        got = committed_from(broker.bootstrap, topic, start)
        expected = [o for o in everything if o >= start]
        verdict = "as expected" if got == expected else "RECORDS SKIPPED"
        print(f"from offset {start}: {len(got)} of {len(expected)} committed records ({verdict})")
