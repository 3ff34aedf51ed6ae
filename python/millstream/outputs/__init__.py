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

import importlib
from typing import TYPE_CHECKING, Any

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

_ON_FIRST_USE = frozenset({"KafkaPublisher", "KafkaSink", "KafkaTarget", "PublisherError"})

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


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        value = getattr(importlib.import_module("millstream.outputs.kafka_sink"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
