"""The mapper's side of GetRows: a gRPC server in front of the mapper's handler, a thin
adapter over :func:`millstream.rpc.serving.serve_get_rows` (the in-process transport
serves calls through the same function)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc

from millstream.exceptions import CommittedIndexError, StaleMapperError
from millstream.rpc import millstream_pb2, millstream_pb2_grpc
from millstream.rpc.calls import RowsHandler, max_payload_bytes
from millstream.rpc.serving import route, serve_get_rows

_MAX_HOLD_SECONDS = 120.0
"""The longest a Hold call is held, whatever the request says."""

_PINGS = [
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
]
"""Reducers' channels ping every 2 s (``rpc.client.KEEPALIVE_SECONDS``) to find connections
a cut left half-open: accept it (gRPC's default answers a third ping within 5 minutes
without data with GOAWAY, dropping the connection and every call on it)."""


class _Servicer(millstream_pb2_grpc.MapperServicer):
    def __init__(
        self,
        handlers: RowsHandler | Mapping[str, RowsHandler],
        max_bytes: int,
        max_held: int,
    ) -> None:
        self._handlers = handlers
        self._max_bytes = max_bytes
        self._held = threading.BoundedSemaphore(max_held)
        self._lock = threading.Lock()
        self._closing = False
        self._holding: set[threading.Event] = set()
        """One event per Hold call held: set when it must answer."""

    def GetRows(
        self, request: millstream_pb2.GetRowsRequest, context: grpc.ServicerContext
    ) -> millstream_pb2.GetRowsResponse:
        # A thin adapter: the serving itself is serve_get_rows, as in process.
        try:
            result = serve_get_rows(
                route(self._handlers, request.mapper_guid),
                reducer_index=request.reducer_index,
                committed_row_index=request.committed_row_index,
                max_rows=request.count,
                max_bytes=request.max_bytes,
                mapper_guid=request.mapper_guid,
                after_row_index=(
                    request.after_row_index if request.HasField("after_row_index") else None
                ),
                shuffle_indices=request.shuffle_indices,
                wait_seconds=request.wait_ms / 1000,
                gather_rows=request.gather_rows,
                start_in_seconds=request.start_in_ms / 1000,
                max_response_bytes=self._max_bytes,
                is_active=context.is_active,
            )
        except StaleMapperError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except (CommittedIndexError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return millstream_pb2.GetRowsResponse(
            row_count=result.row_count,
            last_shuffle_row_index=result.last_shuffle_row_index,
            arrow_ipc=result.arrow_ipc,
            behind=result.behind,
            input_ended=result.input_ended,
        )

    def Hold(
        self, request: millstream_pb2.HoldRequest, context: grpc.ServicerContext
    ) -> millstream_pb2.HoldResponse:
        # Holds one of the pool's threads of its own, asleep, until the time is up, the
        # caller cancels (closes its channel, ends) or the server stops. More callers than
        # the server keeps threads for are told at once (they start threads per call).
        if not self._held.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no thread left to hold the call")
        ended = threading.Event()
        try:
            with self._lock:
                if self._closing:
                    ended.set()
                self._holding.add(ended)
            if context.add_callback(ended.set):
                ended.wait(min(max(0, request.hold_ms) / 1000, _MAX_HOLD_SECONDS))
        finally:
            with self._lock:
                self._holding.discard(ended)
            self._held.release()
        return millstream_pb2.HoldResponse()

    def close(self) -> None:
        """The server stops: Hold calls answer at once, new ones too."""
        with self._lock:
            self._closing = True
            for ended in self._holding:
                ended.set()


class RowsServer:
    """A started gRPC server for one mapper worker.

    Args:
        handler: Serves the calls: one handler, or one per mapper instance GUID (a mapper
            worker reading several partitions serves them all on one port; each call
            names the instance it is for).
        bind: ``host:port`` to listen on; port 0 picks a free one.
        max_message_bytes: gRPC send/receive limit.
        max_response_bytes: Byte cap of one response's Arrow IPC payload (kept below what
            ``max_message_bytes`` can carry).
        max_concurrent_calls: GetRows calls served at once (one per reducer and mapper
            instance served is enough).
        max_held_calls: Hold calls held at once (one per reducer; a reducer beyond that
            starts a thread per call, as gRPC's client does without one).
        credentials: TLS credentials (mutual TLS, :mod:`millstream.rpc.tls`); None:
            plaintext.
    """

    def __init__(
        self,
        handler: RowsHandler | Mapping[str, RowsHandler],
        bind: str,
        max_message_bytes: int,
        max_response_bytes: int,
        *,
        max_concurrent_calls: int = 8,
        max_held_calls: int = 8,
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        self._server = grpc.server(
            ThreadPoolExecutor(
                max_workers=max(1, max_concurrent_calls) + max(0, max_held_calls),
                thread_name_prefix="getrows",
            ),
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.so_reuseport", 0),
                *_PINGS,
            ],
        )
        self._servicer = _Servicer(
            handler,
            min(max_response_bytes, max_payload_bytes(max_message_bytes)),
            max(0, max_held_calls),
        )
        millstream_pb2_grpc.add_MapperServicer_to_server(self._servicer, self._server)
        if credentials is None:
            self.port = self._server.add_insecure_port(bind)
        else:
            self.port = self._server.add_secure_port(bind, credentials)
        if self.port == 0:
            raise OSError(f"cannot listen on {bind} for GetRows")
        self._server.start()

    def stop(self, grace: float = 0.5) -> None:
        """Stop serving; in-flight calls get ``grace`` seconds (Hold calls none)."""
        self._servicer.close()
        self._server.stop(grace).wait()
