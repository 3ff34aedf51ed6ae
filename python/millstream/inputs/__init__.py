"""Inputs: replayable, trimmable partitioned sources (thesis 4.2)."""

from millstream.inputs.base import Input, PartitionReader, ReadResult, WaitingReader
from millstream.inputs.parquet_log import ParquetLog
from millstream.inputs.queue_producer import QueueProducer
from millstream.inputs.store_queue import StoreQueue

__all__ = [
    "Input",
    "ParquetLog",
    "PartitionReader",
    "QueueProducer",
    "ReadResult",
    "StoreQueue",
    "WaitingReader",
]
