"""Mapper and reducer workers, and the one entry point every runner uses.

The protocol lives in :class:`MapperWorker` and :class:`ReducerWorker` as plain methods
with injected dependencies (store, clock, reader, RPC client). :func:`run_worker`
(:mod:`.serve`) is the thin serving layer around them: the gRPC server or client, the
heartbeat thread (:mod:`.heartbeat`) and the main loop.
"""

from millstream.backoff import Backoff
from millstream.workers.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
from millstream.workers.heartbeat import Heartbeat
from millstream.workers.mapper import MapperWorker
from millstream.workers.reducer import ReducerWorker
from millstream.workers.serve import run_worker

__all__ = [
    "SYSTEM_CLOCK",
    "Backoff",
    "Clock",
    "Heartbeat",
    "ManualClock",
    "MapperWorker",
    "ReducerWorker",
    "SystemClock",
    "run_worker",
]
