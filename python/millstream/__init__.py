"""millstream: a streaming MapReduce shuffle with exactly-once delivery.

Rows travel from mappers to reducers through memory and gRPC, never through disk; each
reducer batch commits together with its bookkeeping in one store transaction.
"""

from millstream._core import __version__

__all__ = ["__version__"]
