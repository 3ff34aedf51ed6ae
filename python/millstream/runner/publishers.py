"""The publisher processes of a run: one per partition of each :class:`KafkaSink` among a
processor's outputs, restarted when they die, finished once their partition is sealed (the
processor drained) and published.

Each runs ``python -m millstream.runner.publishers`` with its sink and partition pickled on
stdin, in a process of its own: a publisher whose producer hangs inside librdkafka ends with
:class:`~millstream.outputs.kafka_sink.PublisherError`, and only the end of its process
stops that producer (see :mod:`millstream.outputs.kafka_sink`).
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from millstream.exceptions import CrashLoopError
from millstream.outputs.kafka_sink import KafkaPublisher, KafkaSink, PublisherError
from millstream.tuning import RestartStrategy

log = logging.getLogger(__name__)

EXIT_PUBLISHER_ERROR = 3
"""A publisher's exit code when it ended on a :class:`PublisherError`."""


@dataclass
class _Publisher:
    sink: KafkaSink
    partition: int
    process: subprocess.Popen[bytes] | None = None
    deaths: list[float] = field(default_factory=list)
    died_at: float | None = None
    done: bool = False


@dataclass
class PublisherProcesses:
    """Supervises the publishers of ``sinks``: :meth:`poll` restarts dead ones (with the
    processor's restart strategy) and says whether all finished."""

    sinks: Sequence[KafkaSink]
    restart: RestartStrategy
    restarts: int = 0
    """Publishers restarted after dying."""
    _publishers: list[_Publisher] = field(default_factory=list)

    @classmethod
    def of_outputs(cls, outputs: Sequence[Any], restart: RestartStrategy) -> PublisherProcesses:
        """The publishers of every :class:`KafkaSink` in ``outputs``."""
        return cls([o for o in outputs if isinstance(o, KafkaSink)], restart)

    def start(self) -> None:
        """Start a publisher per sink partition."""
        for sink in self.sinks:
            for partition in range(sink.num_partitions):
                publisher = _Publisher(sink, partition)
                self._spawn(publisher)
                self._publishers.append(publisher)

    def _spawn(self, publisher: _Publisher) -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "millstream.runner.publishers"],
            stdin=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(pickle.dumps((publisher.sink, publisher.partition)))
        publisher.process = process
        publisher.died_at = None

    def pids(self) -> dict[tuple[str, int], int]:
        """The live publishers' process ids, by (queue, partition)."""
        return {
            (p.sink.name, p.partition): p.process.pid
            for p in self._publishers
            if p.process is not None and p.process.poll() is None
        }

    def poll(self) -> bool:
        """Restart dead publishers; True once every one finished its partition.

        Raises:
            CrashLoopError: A publisher died more often than the restart strategy allows
                (its processes' stderr says why); every publisher is stopped first.
        """
        finished = True
        now = time.monotonic()
        for publisher in self._publishers:
            if publisher.done:
                continue
            assert publisher.process is not None
            code = publisher.process.poll()
            if code == 0:
                publisher.done = True
                continue
            finished = False
            if code is None:
                continue
            if publisher.died_at is None:
                publisher.died_at = now
                interval = self.restart.interval_seconds
                publisher.deaths = [t for t in publisher.deaths if now - t < interval]
                publisher.deaths.append(now)
                if len(publisher.deaths) > self.restart.max_restarts:
                    self.stop()
                    raise CrashLoopError(
                        f"the publisher of queue {publisher.sink.name!r} partition "
                        f"{publisher.partition} to topic {publisher.sink.target.topic!r} died "
                        f"{len(publisher.deaths)} times within {interval:g} s (last exit code "
                        f"{code}; its stderr says why): are the brokers "
                        f"{publisher.sink.target.bootstrap_servers} up?"
                    )
            if now - publisher.died_at < self.restart.backoff(len(publisher.deaths)):
                continue
            log.warning(
                "publisher of %s partition %d exited with %d; restarting",
                publisher.sink.name,
                publisher.partition,
                code,
            )
            self._spawn(publisher)
            self.restarts += 1
        return finished

    def stop(self) -> None:
        """Kill every live publisher (what it had open is aborted by the next one)."""
        for publisher in self._publishers:
            if publisher.process is not None and publisher.process.poll() is None:
                publisher.process.kill()
            if publisher.process is not None:
                publisher.process.wait()


def main() -> int:
    """A publisher process: publish the partition read from stdin until it is sealed and
    published."""
    sink, partition = pickle.loads(sys.stdin.buffer.read())
    publisher = KafkaPublisher(sink, partition, sink.target)
    try:
        publisher.run()
    except PublisherError as exc:
        print(f"millstream publisher: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_PUBLISHER_ERROR)  # a producer stuck in librdkafka cannot be closed
    publisher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
