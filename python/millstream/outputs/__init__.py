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

The Kafka sink's module loads on first use (``ms.outputs.KafkaSink``), so that a job
without Kafka, and every worker process, starts without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from millstream.first_use import on_first_use
from millstream.inputs.store_queue import StoreQueue
from millstream.outputs.parquet_sink import STAGING, ParquetSink, StagedFile
from millstream.outputs.staged import (
    Output,
    StagedOutputs,
    check_outputs,
    finish_publishing,
    seal_queues,
)

if TYPE_CHECKING:
    from millstream.outputs.kafka_sink import (
        KafkaPublisher,
        KafkaSink,
        KafkaTarget,
        PublisherError,
    )

_ON_FIRST_USE = dict.fromkeys(
    ["KafkaPublisher", "KafkaSink", "KafkaTarget", "PublisherError"],
    "millstream.outputs.kafka_sink",
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

__getattr__, __dir__ = on_first_use(__name__, _ON_FIRST_USE)
