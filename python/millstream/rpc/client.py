"""The reducer's side of GetRows: one concurrent call per live mapper (thesis 4.4.2 step 3)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from millstream.exceptions import StaleMapperError
from millstream.rpc import millstream_pb2, millstream_pb2_grpc
from millstream.rpc.calls import GetRowsCall, GetRowsResult, RowsClient

__all__ = ["GetRowsCall", "GetRowsResult", "GrpcRowsClient", "RowsClient"]


class GrpcRowsClient:
    """GetRows over gRPC, one cached channel per mapper address."""

    def __init__(
        self, timeout_seconds: float, max_message_bytes: int, *, max_concurrent_calls: int = 8
    ) -> None:
        self._timeout = timeout_seconds
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, millstream_pb2_grpc.MapperStub]] = {}
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, max_concurrent_calls), thread_name_prefix="getrows"
        )

    def _stub(self, address: str) -> millstream_pb2_grpc.MapperStub:
        with self._lock:
            entry = self._channels.get(address)
            if entry is None:
                channel = grpc.insecure_channel(address, options=self._options)
                entry = (channel, millstream_pb2_grpc.MapperStub(channel))
                self._channels[address] = entry
            return entry[1]

    def _call(self, call: GetRowsCall) -> GetRowsResult:
        request = millstream_pb2.GetRowsRequest(
            count=call.max_rows,
            reducer_index=call.reducer_index,
            committed_row_index=call.committed_row_index,
            mapper_id=call.mapper_guid,
            max_bytes=call.max_bytes,
        )
        try:
            response = self._stub(call.address).GetRows(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise StaleMapperError(exc.details() or "stale mapper id") from None
            raise
        return GetRowsResult(
            response.row_count, response.last_shuffle_row_index, response.arrow_ipc
        )

    def get_rows_many(self, calls: Sequence[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        """Call every mapper at once and wait for all answers."""
        futures = [self._pool.submit(self._call, call) for call in calls]
        results: list[GetRowsResult | BaseException] = []
        for future in futures:
            try:
                results.append(future.result())
            except Exception as exc:
                results.append(exc)
        return results

    def close(self) -> None:
        """Close every channel and the thread pool."""
        with self._lock:
            channels, self._channels = self._channels, {}
        for channel, _ in channels.values():
            channel.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
