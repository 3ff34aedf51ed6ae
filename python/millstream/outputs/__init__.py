"""Outputs: where a reducer's commit sends rows besides its own keys, exactly once.

- :class:`~millstream.inputs.StoreQueue`: rows appended in the reducer's transaction, so a
  processor reading the queue consumes them exactly once (a pipeline of processors);
- :class:`ParquetSink`: Parquet files published by the reducer's transaction;
- :class:`KafkaSink`: a store queue the local runner publishes to a Kafka topic (a
  :class:`KafkaPublisher` per partition), exactly once for ``read_committed`` consumers.

A processor declares its outputs (``Processor(outputs=[...])``) and its reducers write to
them through :meth:`~millstream.Transaction.append` and
:meth:`~millstream.Transaction.write_parquet`; :class:`StagedOutputs` holds what one
``reduce`` wrote until the commit.
"""

from millstream.inputs.store_queue import StoreQueue
from millstream.outputs.kafka_sink import KafkaPublisher, KafkaSink, KafkaTarget, PublisherError
from millstream.outputs.parquet_sink import STAGING, ParquetSink, StagedFile
from millstream.outputs.staged import (
    Output,
    StagedOutputs,
    check_outputs,
    finish_publishing,
    seal_queues,
)

__all__ = [
    "STAGING",
    "KafkaPublisher",
    "KafkaSink",
    "KafkaTarget",
    "Output",
    "ParquetSink",
    "PublisherError",
    "StagedFile",
    "StagedOutputs",
    "StoreQueue",
    "check_outputs",
    "finish_publishing",
    "seal_queues",
]
