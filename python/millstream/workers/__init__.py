"""Mapper and reducer workers, and the one entry point every runner uses.

The protocol lives in :class:`MapperWorker` (:mod:`.mapper_worker`) and
:class:`ReducerWorker` (:mod:`.reducer_worker`) as plain methods with injected
dependencies (store, clock, reader, RPC client), one module per step. :func:`run_worker`
(:mod:`.serve`) is the thin serving layer around them: the gRPC server or client, the
heartbeat thread (:mod:`.heartbeat`) and the main loop. Shared by both: the checks that
fence off a second instance (:mod:`.fencing`), time (:mod:`.clock`), a worker's view of
discovery (:mod:`.discovery_view`), the figures it publishes (:mod:`.status_report`) and
its Prometheus metrics (:mod:`.prometheus`).
"""

from millstream.backoff import Backoff
from millstream.workers.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
from millstream.workers.heartbeat import Heartbeat
from millstream.workers.mapper_worker import MapperWorker
from millstream.workers.reducer_worker import ReducerWorker
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
