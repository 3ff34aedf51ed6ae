"""How far a processor reading a Kafka topic is behind the topic: per input partition, the
mapper's persisted next offset (its continuation token, see :mod:`millstream.inputs.kafka_topic`)
against the partition's last stable offset, asked of the brokers.

What ``millstream status --kafka-bootstrap ADDR --kafka-topic TOPIC`` shows as lag. Offsets,
not records: transaction markers and aborted records count too, so a lag may be a few
offsets that no row will ever fill.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from millstream.exceptions import InputError
from millstream.inputs.kafka_topic import _decode_token, _kafka


@dataclass(frozen=True)
class PartitionLag:
    """One partition: the next offset the processor reads and the partition's end."""

    next_offset: int
    end_offset: int

    @property
    def lag(self) -> int:
        """Offsets between the processor's position and the end (0 when caught up)."""
        return max(0, self.end_offset - self.next_offset)


def kafka_lag(
    bootstrap_servers: str, topic: str, tokens: Mapping[int, bytes], timeout: float = 10.0
) -> dict[int, PartitionLag]:
    """The lag of each partition in ``tokens`` (partition: the mapper's persisted token; an
    empty token, nothing persisted yet, counts from the partition's log start).

    Raises:
        InputError: The brokers did not answer, or the topic lacks a partition.
    """
    kafka = _kafka()
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "millstream-status",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",  # the end is the last stable offset
        }
    )
    try:
        lags = {}
        for partition, token in sorted(tokens.items()):
            try:
                low, end = consumer.get_watermark_offsets(
                    kafka.TopicPartition(topic, partition), timeout=timeout, cached=False
                )
            except kafka.KafkaException as exc:
                raise InputError(
                    f"cannot read the end offset of topic {topic!r} partition {partition} "
                    f"from {bootstrap_servers}: {exc}"
                ) from exc
            next_offset = _decode_token(token) if token else int(low)
            lags[partition] = PartitionLag(next_offset, int(end))
        return lags
    finally:
        consumer.close()


__all__ = ["PartitionLag", "kafka_lag"]
