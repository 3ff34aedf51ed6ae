"""One hop between processes on the store's floor (:mod:`bench.latency_floor`, ``--committers``).

millstream's mappers and reducers are separate processes, and a row reaches its reducer's
commit through a gRPC call (DESIGN: rows move through memory and gRPC). The floor's
readers commit their own reads; with ``--committers N`` they instead split each read's rows
among N committer processes by key, and send each committer, in one gRPC call, the
per-key sums of its rows, their count, the read's end position and their append stamps.
A committer commits each call in one transaction, one at a time in the order the calls
come (as a reducer's loop commits each mapper's answer as it comes), and answers after
the commit. A reader trims its partition only after every call was answered (after the
commits, as a mapper trims after the reducers' commits). What is measured is the floor's
path plus the hop: N more processes on the cores, a gRPC call, and N writers of the store
committing each reader's rows (with two readers, twice the commits of the readers'
own for N = 2, as reducers committing each mapper's answer make).

With ``rounds`` (``--rounds``), a committer commits as a reducer's round in the default
layout does: it holds the calls until it has one from every reader, or
:data:`ROUND_WAIT_SECONDS` after the call that came first (``get_rows_wait_seconds``), and
commits them together in one transaction, answering each after. A reader's call waits for
the other readers' rows, as a mapper's answer waits for the other mappers' in a round.

The payload is a pickle of the sums' Arrow IPC stream and two int64 arrays: no protobuf,
no window, no bookkeeping. The committer saves (append ns, rows, commit ns) per append as
the floor's readers do.
"""

from __future__ import annotations

import dataclasses
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
from millstream.state import StoreTransaction

from bench.latency_stats import save_append_times

METHOD = "/floor.Hop/Commit"
"""The committer's one method: bytes in (a pickled read), empty bytes out after the commit."""

ROUND_WAIT_SECONDS = 0.1
"""With rounds, the longest a call waits for the other readers' calls: the default
``Tuning.get_rows_wait_seconds``, a round's wait for its mappers' answers."""


@dataclasses.dataclass
class _Read:
    """One reader's call, waiting for its commit."""

    partition: int
    sums: pa.Table
    rows: int
    end: int
    stamps: np.ndarray
    counts: np.ndarray
    committed: bool = False


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


class HopClient:
    """A reader's end of the hop: each read's rows split among the committers by key, one
    call to each committer with rows, all sent at once; returns when every one of them
    has committed."""

    def __init__(self, addresses: list[str]) -> None:
        self._channels = [grpc.insecure_channel(address) for address in addresses]
        self._calls = [channel.unary_unary(METHOD) for channel in self._channels]

    def commit(self, partition: int, table: pa.Table, end: int) -> None:
        """Send the rows of one read (``key``, ``value``, ``append_ns``), ending at ``end``
        of ``partition``; wait until each committer that got rows has committed them."""
        committer = table["key"].combine_chunks().to_numpy() % len(self._calls)
        calls = []
        for index, call in enumerate(self._calls):
            rows = table.filter(pa.array(committer == index))
            if not rows.num_rows:
                continue
            sums = rows.group_by("key", use_threads=False).aggregate([("value", "sum")])
            stamps, counts = np.unique(
                rows["append_ns"].combine_chunks().to_numpy(), return_counts=True
            )
            payload = (partition, _ipc(sums), rows.num_rows, end, stamps, counts)
            calls.append(call.future(pickle.dumps(payload, protocol=5), timeout=60.0))
        for future in calls:
            future.result()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


def serve_commits(
    url: str,
    partitions: int,
    out: Path,
    ready: Connection,
    stop: Event,
    commit: Callable[..., None],
    rounds: bool = False,
) -> None:
    """The committer process: serve :data:`METHOD` until ``stop``, committing each call's
    read with ``commit(txn, partition=, sums=, rows=, end=)`` (the floor's own transaction)
    one transaction at a time, each call in its own or, with ``rounds``, the calls of every
    reader together; then save the commit times. Sends its port through ``ready``."""
    from millstream.inputs import StoreQueue

    from bench.queue_producer import QUEUE_NAME, QUEUE_PREFIX

    queue = StoreQueue(url, QUEUE_NAME, partitions, prefix=QUEUE_PREFIX)
    store = queue.store
    appends: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    commits: list[np.ndarray] = []
    changed = threading.Condition()
    waiting: list[_Read] = []

    def commit_waiting(txn: StoreTransaction) -> None:
        for read in waiting:
            commit(txn, partition=read.partition, sums=read.sums, rows=read.rows, end=read.end)

    def handle(request: bytes, _context: Any) -> bytes:
        partition, ipc, count, end, stamps, counts = pickle.loads(request)
        sums = pa.ipc.open_stream(ipc).read_all()
        read = _Read(partition, sums, count, end, stamps, counts)
        deadline = time.monotonic() + ROUND_WAIT_SECONDS
        with changed:
            waiting.append(read)
            while not read.committed:
                every_reader = len({w.partition for w in waiting}) >= partitions
                if rounds and not every_reader and time.monotonic() < deadline:
                    changed.wait(deadline - time.monotonic())
                    continue
                store.transact(commit_waiting)
                committed = time.time_ns()
                for done in waiting:
                    done.committed = True
                    appends.append(done.stamps)
                    rows.append(done.counts)
                    commits.append(np.full(done.stamps.size, committed, np.int64))
                waiting.clear()
                changed.notify_all()
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
    save_append_times(out, appends, rows, commits)
    queue.close()
