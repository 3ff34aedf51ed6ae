"""noida-db 0.2.3: a transaction in use across a broker restart is never ended.

A transactional producer writes in a transaction, the broker restarts, the producer writes
more in the same transaction, then dies (kill -9 of its process). A successor with the same
transactional.id must abort that transaction in init_transactions (or the broker must abort
it after transaction.timeout.ms); then its own committed records are visible to
read_committed consumers. On noida-db they are not, for good: the last stable offset stays
at the dead transaction's first record. Without the restart the same steps behave.

Run: python noida_restart_hangs_transaction.py [--no-restart]
"""

import os
import signal
import subprocess
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # the repository root
from tests.support.kafka_broker import new_topic, noida_broker

RESTART = "--no-restart" not in sys.argv
CHILD = """
import sys
from confluent_kafka import Producer
bootstrap, topic = sys.argv[1:]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "tx",
              "transaction.timeout.ms": 10000, "log_level": 0})
p.init_transactions(10)
p.begin_transaction()
p.produce(topic, b"first", partition=0)
assert p.flush(10) == 0
print("in transaction", flush=True)
sys.stdin.readline()  # the broker restarts here
p.produce(topic, b"second", partition=0)
p.flush(30)
print("wrote after the restart", flush=True)
sys.stdin.readline()  # killed here
"""

with noida_broker() as broker:
    topic = new_topic(broker.bootstrap, 1)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, broker.bootstrap, topic],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    print("child:", child.stdout.readline().strip())
    if RESTART:
        broker.stop()
        time.sleep(1)
        broker.start()
    child.stdin.write("\n")
    child.stdin.flush()
    print("child:", child.stdout.readline().strip())
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    successor = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "transactional.id": "tx",
            "transaction.timeout.ms": 10000,
            "log_level": 0,
        }
    )
    successor.init_transactions(30)  # aborts the dead producer's transaction
    successor.begin_transaction()
    for _ in range(100):
        successor.produce(topic, b"committed", partition=0)
    successor.commit_transaction(30)
    time.sleep(12)  # and past transaction.timeout.ms
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "check",
            "isolation.level": "read_committed",
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    while (message := consumer.poll(5)) is not None:
        seen += message.error() is None
    stable = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    consumer.close()
    print(
        f"restart: {RESTART}; read_committed sees {seen} of the 100 committed records; "
        f"last stable offset {stable}"
    )
