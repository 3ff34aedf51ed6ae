"""millstream: a streaming MapReduce shuffle with exactly-once delivery.

Rows travel from mappers to reducers through memory and gRPC, never through disk; each
reducer batch commits together with its bookkeeping in one store transaction.

    import millstream as ms

    processor = ms.Processor(mapper=MyMapper, reducer=MyReducer,
                             input=ms.inputs.ParquetLog("data/"),
                             store="sqlite:///tmp/state.db", num_reducers=2)
    ms.run_local(processor)

The names below are imported on first use: ``import millstream`` alone costs almost
nothing, so that a runner can start its fork server (which imports pyarrow, gRPC and the
workers once for all of them) before it pays for those imports itself.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# gRPC's fork handlers restart its pollers in every child that a process with live channels
# or servers forks, and such a child can crash before it execs (grpc/grpc#43055: here 3-9 of
# 500 `subprocess.Popen(..., preexec_fn=...)` children, the way PySpark starts its JVM).
# millstream opens no channel or server before a fork (workers start from a fork server
# that opens none, or as Spark's own workers), so it needs no handlers: they are off unless
# the environment sets them.
# gRPC reads the variable when it is imported: millstream's own import of it comes after.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

if TYPE_CHECKING:
    from millstream import event_time, exceptions, inputs, outputs
    from millstream._core import __version__
    from millstream.api import Mapper, Partitioned, Reducer, Transaction, WorkerSpec
    from millstream.inputs.base import Input, PartitionReader, ReadResult
    from millstream.ledger import RunSummary
    from millstream.ledger.dead_letters import DeadLetter, read_dead_letters
    from millstream.processor import Processor
    from millstream.queue_reducer import PendingRows, QueueReducer
    from millstream.runner.local import run_local
    from millstream.runner.pipeline import run_local_pipeline
    from millstream.runner.rescaler import RescaleSummary, rescale
    from millstream.runner.signals import RunStopped
    from millstream.tuning import RestartStrategy, Tuning

_WHERE = {
    "DeadLetter": "millstream.ledger.dead_letters",
    "Input": "millstream.inputs.base",
    "Mapper": "millstream.api",
    "PartitionReader": "millstream.inputs.base",
    "Partitioned": "millstream.api",
    "PendingRows": "millstream.queue_reducer",
    "Processor": "millstream.processor",
    "QueueReducer": "millstream.queue_reducer",
    "ReadResult": "millstream.inputs.base",
    "Reducer": "millstream.api",
    "RescaleSummary": "millstream.runner.rescaler",
    "RestartStrategy": "millstream.tuning",
    "RunStopped": "millstream.runner.signals",
    "RunSummary": "millstream.ledger",
    "Transaction": "millstream.api",
    "Tuning": "millstream.tuning",
    "WorkerSpec": "millstream.api",
    "run_local": "millstream.runner.local",
    "run_local_pipeline": "millstream.runner.pipeline",
    "rescale": "millstream.runner.rescaler",
    "read_dead_letters": "millstream.ledger.dead_letters",
    "__version__": "millstream._core",
}
_SUBMODULES = ("event_time", "exceptions", "inputs", "outputs")
_DEPRECATED_SUBMODULES = ("windows",)  # millstream.event_time; it warns when imported


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES or name in _DEPRECATED_SUBMODULES:
        return importlib.import_module(f"millstream.{name}")
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'millstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE, *_SUBMODULES])


__all__ = [
    "DeadLetter",
    "Input",
    "Mapper",
    "PartitionReader",
    "Partitioned",
    "PendingRows",
    "Processor",
    "QueueReducer",
    "ReadResult",
    "Reducer",
    "RescaleSummary",
    "RestartStrategy",
    "RunStopped",
    "RunSummary",
    "Transaction",
    "Tuning",
    "WorkerSpec",
    "__version__",
    "event_time",
    "exceptions",
    "inputs",
    "outputs",
    "read_dead_letters",
    "rescale",
    "run_local",
    "run_local_pipeline",
]
