"""Inputs: replayable, trimmable partitioned sources (thesis 4.2)."""

from millstream.inputs.base import Input, PartitionReader, ReadResult, WaitingReader
from millstream.inputs.kafka_decoders import Avro, Json, RawBytes, ValueDecoder
from millstream.inputs.kafka_topic import KafkaTopic
from millstream.inputs.parquet_log import ParquetLog
from millstream.inputs.queue_producer import QueueProducer
from millstream.inputs.store_queue import StoreQueue

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
