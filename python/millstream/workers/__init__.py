"""Mapper and reducer workers, and the one entry point every runner uses."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from millstream.exceptions import RetryableStoreError, StoreUnavailableError
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer
from millstream.state import Store, Transaction
from millstream.state.records import (
    check_processor_info,
    register_worker,
    unregister_worker,
    write_worker_status,
)
from millstream.workers.clock import SYSTEM_CLOCK
from millstream.workers.mapper import MapperWorker, drained_key
from millstream.workers.reducer import ReducerWorker, reduced_key

if TYPE_CHECKING:
    from millstream.processor import Processor

log = logging.getLogger("millstream.workers")

ROLES = ("mapper", "reducer")


class _Heartbeat:
    """Refreshes discovery and publishes status every ``period`` seconds."""

    def __init__(
        self,
        store: Store,
        role: str,
        index: int,
        guid: str,
        address: str,
        period: float,
        metrics: object,
    ) -> None:
        self._store = store
        self._role, self._index, self._guid, self._address = role, index, guid, address
        self._period = period
        self._metrics = metrics
        self._last = -1e18

    def beat(self, *, force: bool = False) -> None:
        now = SYSTEM_CLOCK.now()
        if not force and now - self._last < self._period:
            return
        self._last = now
        metrics = self._metrics() if callable(self._metrics) else {}

        def write(txn: Transaction) -> None:
            register_worker(
                txn, self._role, self._index, self._guid, self._address, SYSTEM_CLOCK.wall()
            )
            write_worker_status(
                txn, self._role, self._index, {**metrics, "time": SYSTEM_CLOCK.wall()}
            )

        try:
            self._store.transact(write, max_retries=3)
        except (RetryableStoreError, StoreUnavailableError) as exc:
            log.warning("%s %d: heartbeat failed: %s", self._role, self._index, exc)

    def leave(self) -> None:
        try:
            self._store.transact(
                lambda txn: unregister_worker(txn, self._role, self._index, self._guid),
                max_retries=3,
            )
        except (RetryableStoreError, StoreUnavailableError) as exc:
            log.warning("%s %d: leaving discovery failed: %s", self._role, self._index, exc)


def run_worker(
    processor: Processor,
    role: str,
    index: int,
    stop: threading.Event | None = None,
    *,
    guid: str | None = None,
) -> None:
    """Run one worker in this process until its work drains or ``stop`` is set.

    Every runner (local processes, Spark tasks) calls this. It returns normally once the
    worker is done (mapper: all its rows committed; reducer: every mapper drained).

    Raises:
        ConfigurationError: The store holds a processor with other counts or classes.
        UserCodeError: The user's ``map`` or ``reduce`` raised.
        MillstreamError: Other failures, with what to do.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    stop = stop or threading.Event()
    store = processor.open_store()
    try:
        store.transact(lambda txn: check_processor_info(txn, processor.info))
        if role == "mapper":
            _run_mapper(processor, index, store, stop, guid)
        else:
            _run_reducer(processor, index, store, stop, guid)
    finally:
        store.close()


def _run_mapper(
    processor: Processor, index: int, store: Store, stop: threading.Event, guid: str | None
) -> None:
    t = processor.tuning
    worker = MapperWorker(processor, index, store, guid=guid)
    store.transact(lambda txn: txn.clear(drained_key(index)))
    server = RowsServer(worker, "0.0.0.0:0", t.grpc_max_message_bytes, t.get_rows_max_bytes)
    address = f"{t.advertise_host}:{server.port}"
    beat = _Heartbeat(
        store, "mapper", index, worker.guid, address, t.heartbeat_seconds, worker.metrics
    )
    try:
        beat.beat(force=True)
        worker.run(stop, on_tick=beat.beat)
        beat.beat(force=True)
    finally:
        beat.leave()
        server.stop()
        worker.close()


def _run_reducer(
    processor: Processor, index: int, store: Store, stop: threading.Event, guid: str | None
) -> None:
    t = processor.tuning
    client = GrpcRowsClient(t.rpc_timeout_seconds, t.grpc_max_message_bytes)
    worker = ReducerWorker(processor, index, store, client, guid=guid)
    beat = _Heartbeat(store, "reducer", index, worker.guid, "", t.heartbeat_seconds, worker.metrics)
    try:
        beat.beat(force=True)
        worker.run(stop, on_tick=beat.beat)
        beat.beat(force=True)
    finally:
        beat.leave()
        client.close()


__all__ = ["MapperWorker", "ReducerWorker", "drained_key", "reduced_key", "run_worker"]
