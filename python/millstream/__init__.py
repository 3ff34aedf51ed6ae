"""millstream: a streaming MapReduce shuffle with exactly-once delivery.

Rows travel from mappers to reducers through memory and gRPC, never through disk; each
reducer batch commits together with its bookkeeping in one store transaction.

    import millstream as ms

    processor = ms.Processor(mapper=MyMapper, reducer=MyReducer,
                             input=ms.inputs.ParquetLog("data/"),
                             store="sqlite:///tmp/state.db", num_reducers=2)
    processor.run_local()
"""

from millstream import exceptions, inputs
from millstream._core import __version__
from millstream.api import Mapper, Partitioned, Reducer, Transaction, Tuning, WorkerSpec
from millstream.inputs.base import PartitionReader, ReadResult
from millstream.processor import Input, Processor
from millstream.runner.local import RunSummary

__all__ = [
    "Input",
    "Mapper",
    "PartitionReader",
    "Partitioned",
    "Processor",
    "ReadResult",
    "Reducer",
    "RunSummary",
    "Transaction",
    "Tuning",
    "WorkerSpec",
    "__version__",
    "exceptions",
    "inputs",
]
