"""One hop between processes on the store's floor (:mod:`bench.latency_floor`, ``--hop``).

millstream's mappers and reducers are separate processes, and a row reaches its reducer's
commit through a gRPC call (DESIGN: rows move through memory and gRPC). The floor's
readers commit their own reads; with ``--hop`` they instead send each read's per-key sums,
its row count, its end position and its rows' append stamps in one gRPC call to a
committer process, which commits them in one transaction per call, in the order the calls
come, one at a time (as one reducer's loop commits), and answers after the commit. A
reader trims its partition only after its call was answered (after the commit, as a
mapper trims after the reducers' commits). What is measured is the floor's path plus the
hop: one more process on the cores, a gRPC call, and one committer for both readers.

The payload is a pickle of the sums' Arrow IPC stream and two int64 arrays: no protobuf,
no window, no rounds, no bookkeeping. The committer saves (append ns, rows, commit ns) per
append as the floor's readers do.
"""

from __future__ import annotations

import functools
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa

METHOD = "/floor.Hop/Commit"
"""The committer's one method: bytes in (a pickled read), empty bytes out after the commit."""


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class HopClient:
    """A reader's end of the hop: one blocking call per read, answered after its commit."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._call = self._channel.unary_unary(METHOD)

    def commit(
        self,
        partition: int,
        sums: pa.Table,
        rows: int,
        end: int,
        stamps: np.ndarray,
        counts: np.ndarray,
    ) -> None:
        """Send one read and wait until the committer has committed it."""
        payload = pickle.dumps((partition, _ipc(sums), rows, end, stamps, counts), protocol=5)
        self._call(payload, timeout=60.0)

    def close(self) -> None:
        self._channel.close()


def serve_commits(
    url: str,
    partitions: int,
    out: Path,
    ready: Connection,
    stop: Event,
    commit: Callable[..., None],
) -> None:
    """The committer process: serve :data:`METHOD` until ``stop``, committing each call's
    read with ``commit(txn, partition=, sums=, rows=, end=)`` (the floor's own transaction)
    in one thread; then save the commit times. Sends its port through ``ready``."""
    from millstream.inputs import StoreQueue

    from bench.queue_producer import QUEUE_NAME, QUEUE_PREFIX

    queue = StoreQueue(url, QUEUE_NAME, partitions, prefix=QUEUE_PREFIX)
    store = queue.store
    appends: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    commits: list[np.ndarray] = []
    lock = threading.Lock()

    def handle(request: bytes, _context: Any) -> bytes:
        partition, ipc, count, end, stamps, counts = pickle.loads(request)
        sums = pa.ipc.open_stream(ipc).read_all()
        with lock:
            store.transact(
                functools.partial(commit, partition=partition, sums=sums, rows=count, end=end)
            )
            committed = time.time_ns()
            appends.append(stamps)
            rows.append(counts)
            commits.append(np.full(stamps.size, committed, np.int64))
        return b""

    handler = grpc.method_handlers_generic_handler(
        "floor.Hop", {"Commit": grpc.unary_unary_rpc_method_handler(handle)}
    )
    # Two threads: both readers' calls are received at once, committed one at a time.
    server = grpc.server(ThreadPoolExecutor(max_workers=2), handlers=(handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ready.send(port)
    stop.wait()
    server.stop(grace=5.0).wait()
    np.savez(
        out,
        append_ns=np.concatenate(appends or [np.zeros(0, np.int64)]),
        rows=np.concatenate(rows or [np.zeros(0, np.int64)]),
        commit_ns=np.concatenate(commits or [np.zeros(0, np.int64)]),
        plan_seconds=np.zeros(0, np.float64),
    )
    queue.close()
