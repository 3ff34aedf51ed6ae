"""The one entry point every runner uses: a worker served in this process, with its gRPC
server (mapper) or client (reducer), its heartbeat and its main loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from millstream.backoff import Backoff
from millstream.exceptions import ConfigurationError, RetryableStoreError, StoreUnavailableError
from millstream.ledger import (
    Metric,
    check_processor_info,
    drained_key,
)
from millstream.ledger.subspaces import check_role
from millstream.rpc.address import LOOPBACK, check_exposure, host_port, mapper_address
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer
from millstream.rpc.tls import TlsFiles, tls_files
from millstream.state import Store, StoreTransaction
from millstream.workers import prometheus
from millstream.workers.mapper_worker import MapperWorker
from millstream.workers.reducer_worker import ReducerWorker
from millstream.workers.status_report import MapperStatus, ReducerStatus

if TYPE_CHECKING:
    from millstream.processor import Processor

from millstream.workers.heartbeat import Heartbeat

log = logging.getLogger(__name__)


def run_worker(
    processor: Processor,
    role: str,
    index: int,
    stop_event: threading.Event | None = None,
    *,
    guid: str | None = None,
    host: str = LOOPBACK,
) -> None:
    """Run one worker in this process until its work drains or ``stop_event`` is set.

    Every runner (local processes, Spark tasks) calls this. It returns normally once the
    worker is done (mapper: every row of its bounded input committed and persisted;
    reducer: every mapper drained) or stopped.

    Args:
        processor: The processor the worker belongs to.
        role: ``"mapper"`` or ``"reducer"``.
        index: The worker's index within its role.
        stop_event: Set it to stop the worker (it then returns).
        guid: This instance's GUID; a fresh one by default.
        host: This machine's address as the other workers reach it: a mapper's server
            binds it and discovery publishes it, unless ``Tuning.advertise_host`` or
            ``Tuning.bind_host`` say otherwise. Loopback by default (every worker on
            this machine).

    Raises:
        ConfigurationError: The store holds a processor with other counts or classes, or
            a mapper would serve plaintext GetRows beyond loopback without
            ``Tuning.plaintext_get_rows`` (:func:`~millstream.rpc.address.check_exposure`).
        UserCodeError: The user's ``map`` or ``reduce`` raised (``on_user_error="stop"``;
            with ``"dead_letter"``: on rows together but none alone, or past the cap).
        MillstreamError: Other failures, with what to do.
    """
    check_role(role)
    count = processor.num_mappers if role == "mapper" else processor.num_reducers
    if not 0 <= index < count:
        raise ValueError(f"{role} index {index} out of range: the processor has {count}")
    stop = stop_event if stop_event is not None else threading.Event()
    store = processor.open_store()
    try:
        if not _check_processor(processor, store, stop, f"{role} {index}"):
            return
        tls = tls_files(processor.tuning)
        if role == "mapper":
            _serve_mapper(processor, index, store, stop, guid, host, tls)
        else:
            _serve_reducer(processor, index, store, stop, guid, tls)
    finally:
        store.close()


def _check_processor(processor: Processor, store: Store, stop: threading.Event, who: str) -> bool:
    """Record the processor in the store, or check it against the one recorded: retried
    with the workers' back-off while the store fails (a store down at a worker's start is
    waited out, as in its loop); False when ``stop`` is set while the store fails."""
    t = processor.tuning
    backoff = Backoff(t.backoff_seconds, t.backoff_max_seconds)
    while True:
        try:
            store.transact(lambda txn: check_processor_info(txn, processor.info), idempotent=True)
            return True
        except (RetryableStoreError, StoreUnavailableError) as exc:
            if stop.is_set():
                return False
            log.warning("%s: store, starting: %s (retrying)", who, exc)
            stop.wait(backoff.next())


def _serve_mapper(
    processor: Processor,
    index: int,
    store: Store,
    stop: threading.Event,
    guid: str | None,
    host: str,
    tls: TlsFiles | None,
) -> None:
    """Serve mapper worker ``index``: one :class:`MapperWorker` per partition it reads
    (sharing the memory limit), one GetRows server for them all, a heartbeat each."""
    t = processor.tuning
    where = mapper_address(t, host)
    check_exposure(where.bind, tls=tls is not None, tuning=t, where=f"mapper {index}")
    partitions = processor.partitions_of(index)
    share = max(1, t.memory_limit_bytes // len(partitions))
    workers = [
        MapperWorker(
            processor,
            p,
            store,
            guid=guid if guid is None or len(partitions) == 1 else f"{guid}.{p}",
            memory_limit_bytes=share,
        )
        for p in partitions
    ]
    try:

        def clear_drained(txn: StoreTransaction) -> None:
            for p in partitions:
                txn.clear(drained_key(p))

        store.transact(clear_drained, idempotent=True)
        try:
            server = RowsServer(
                {worker.guid: worker for worker in workers},
                host_port(where.bind, 0),
                t.grpc_max_message_bytes,
                t.get_rows_max_bytes,
                max_concurrent_calls=max(8, processor.num_reducers * len(workers)),
                # Two per reducer: a restarted reducer's old channel may linger a while.
                max_held_calls=2 * processor.num_reducers,
                credentials=None if tls is None else tls.server_credentials(),
            )
        except (OSError, RuntimeError) as exc:  # grpcio raises either when bind fails
            raise ConfigurationError(
                f"mapper {index} cannot listen on {where.bind!r} for GetRows ({exc}): it is "
                "not an address of this host. Set Tuning.advertise_host to an address of "
                "this host that the reducers reach, or Tuning.bind_host='0.0.0.0' to listen "
                "on every interface."
            ) from exc
        try:
            address = where.endpoint(server.port)
            beats = []
            for worker in workers:
                status: Callable[[], dict[str, Metric]] = MapperStatus(
                    worker.metrics, processor.input, worker.index
                )
                if prometheus.enabled():
                    status = prometheus.WorkerMetrics("mapper", worker.index).following(status)
                beats.append(
                    Heartbeat(
                        store,
                        "mapper",
                        worker.index,
                        worker.guid,
                        address,
                        t.heartbeat_seconds,
                        status,
                    )
                )
            for beat in beats:
                beat.start()
            try:
                _run_together(workers, stop)
            finally:
                for beat in beats:
                    beat.stop()
        finally:
            server.stop()
    finally:
        for worker in workers:
            worker.close()


def _run_together(workers: list[MapperWorker], stop: threading.Event) -> None:
    """Run the partitions' mapper loops until each drains or ``stop`` is set; the first
    one that fails stops the others and its error is raised (the runner then restarts
    the whole worker, each partition from its persisted state)."""
    if len(workers) == 1:
        workers[0].run(stop)
        return
    halt = threading.Event()
    errors: list[BaseException] = []

    def run(worker: MapperWorker) -> None:
        try:
            worker.run(halt)
        except BaseException as exc:
            errors.append(exc)
            halt.set()

    threads = [
        threading.Thread(target=run, args=(w,), name=f"mapper-{w.index}", daemon=True)
        for w in workers
    ]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        if stop.wait(0.05):
            halt.set()
    if errors:
        raise errors[0]


def _serve_reducer(
    processor: Processor,
    index: int,
    store: Store,
    stop: threading.Event,
    guid: str | None,
    tls: TlsFiles | None,
) -> None:
    t = processor.tuning
    client = GrpcRowsClient(
        t.rpc_timeout_seconds,
        t.grpc_max_message_bytes,
        wait_seconds=t.get_rows_wait_seconds,
        credentials=None if tls is None else tls.channel_credentials(),
        server_name=None if tls is None else tls.server_name,
    )
    try:
        worker = ReducerWorker(processor, index, store, client, guid=guid)
        status: Callable[[], dict[str, Metric]] = ReducerStatus(worker.metrics)
        if prometheus.enabled():
            exported = prometheus.WorkerMetrics("reducer", index)
            worker.on_committed = exported.observe_commit
            status = exported.following(status)
        beat = Heartbeat(
            store,
            "reducer",
            index,
            worker.guid,
            "",
            t.heartbeat_seconds,
            status,
        )
        beat.start()
        try:
            worker.run(stop)
        finally:
            beat.stop()
    finally:
        client.close()
