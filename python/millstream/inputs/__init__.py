"""Inputs: replayable, trimmable partitioned sources (thesis 4.2).

The Kafka input's modules load on first use (``ms.inputs.KafkaTopic``), so that a job
without Kafka, and every worker process, starts without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from millstream.first_use import on_first_use
from millstream.inputs.base import Input, PartitionReader, ReadResult, WaitingReader
from millstream.inputs.parquet_log import ParquetLog
from millstream.inputs.queue_producer import QueueProducer
from millstream.inputs.store_queue import StoreQueue

if TYPE_CHECKING:
    from millstream.inputs.kafka_decoders import Avro, Json, RawBytes, ValueDecoder
    from millstream.inputs.kafka_topic import KafkaTopic

_ON_FIRST_USE = {
    "Avro": "millstream.inputs.kafka_decoders",
    "Json": "millstream.inputs.kafka_decoders",
    "RawBytes": "millstream.inputs.kafka_decoders",
    "ValueDecoder": "millstream.inputs.kafka_decoders",
    "KafkaTopic": "millstream.inputs.kafka_topic",
}

__all__ = [
    "Avro",
    "Input",
    "Json",
    "KafkaTopic",
    "ParquetLog",
    "PartitionReader",
    "QueueProducer",
    "RawBytes",
    "ReadResult",
    "StoreQueue",
    "ValueDecoder",
    "WaitingReader",
]

__getattr__, __dir__ = on_first_use(__name__, _ON_FIRST_USE)
