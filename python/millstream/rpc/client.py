"""The reducer's side of GetRows: one call under way per mapper (thesis 4.4.2 step 3).

A round asks every live mapper for rows and waits for their answers at most a short while
(``wait_seconds``), and for the first answer when none has come by then (a mapper without
rows holds the call until rows arrive). A mapper that has not answered by then (frozen,
overloaded, or across a slow link) holds nobody: its call stays under way, is not sent
again, and its answer is used in a later round, as long as it still continues from where
the reducer's committed index stands. The other mappers' rows are committed meanwhile
(thesis 4.4: a slow partition does not hold the others).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

import grpc

from millstream.exceptions import StaleMapperError
from millstream.rpc import millstream_pb2, millstream_pb2_grpc
from millstream.rpc.calls import GetRowsCall, GetRowsResult, NotAnsweredYet, RowsClient

_GATHER_MARGIN_SECONDS = 0.05
"""Extra wait for a gathering call's answer beyond the time the mapper may hold it."""

HOLD_SECONDS = 60.0
"""How long a mapper holds a channel's Hold call (:meth:`GrpcRowsClient._keep_held`)."""

_HOLD_RETRY_SECONDS = 1.0
"""Wait before a channel whose Hold call failed (its mapper down) gets another."""

KEEPALIVE_SECONDS = 2.0
"""How often a channel pings its mapper (HTTP/2 PING, even with no call under way; a
mapper's server accepts them at this rate: ``tests/hosts/test_half_open.py``)."""

KEEPALIVE_TIMEOUT_SECONDS = 3.0
"""A ping unanswered this long closes the connection (gRPC also sets it as the socket's
``TCP_USER_TIMEOUT``): a connection a cut left half-open is given up within
``KEEPALIVE_SECONDS + KEEPALIVE_TIMEOUT_SECONDS`` (5 s), not after TCP's retransmissions
(about 15 minutes), and calls go to a new one."""

RECONNECT_SECONDS = 1.0
"""The least a connection attempt is given, and the longest wait between attempts is
twice this: once a cut heals, a channel connects again within a few seconds (gRPC's
defaults, 20 s and 120 s, can leave a healed mapper unused for minutes)."""


def channel_options(
    max_message_bytes: int, server_name: str | None = None
) -> list[tuple[str, int | str]]:
    """The options of every GetRows channel: message limits, keepalive, reconnection."""
    ms = 1000
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", round(KEEPALIVE_SECONDS * ms)),
        ("grpc.keepalive_timeout_ms", round(KEEPALIVE_TIMEOUT_SECONDS * ms)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.min_reconnect_backoff_ms", round(RECONNECT_SECONDS * ms)),
        ("grpc.initial_reconnect_backoff_ms", round(RECONNECT_SECONDS * ms)),
        ("grpc.max_reconnect_backoff_ms", round(2 * RECONNECT_SECONDS * ms)),
    ]
    if server_name is not None:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


__all__ = [
    "KEEPALIVE_SECONDS",
    "KEEPALIVE_TIMEOUT_SECONDS",
    "RECONNECT_SECONDS",
    "GetRowsCall",
    "GetRowsResult",
    "GrpcRowsClient",
    "NotAnsweredYet",
    "RowsClient",
    "channel_options",
]


class GrpcRowsClient:
    """GetRows over gRPC, one cached channel per mapper address, one call under way per mapper.

    Args:
        timeout_seconds: Deadline of one call; a mapper silent that long fails the call
            (``DEADLINE_EXCEEDED``), and the next round asks again.
        max_message_bytes: gRPC send/receive limit.
        credentials: TLS credentials (mutual TLS, :mod:`millstream.rpc.tls`); None:
            plaintext.
        server_name: The name expected in mappers' certificates; None: the host of each
            mapper's address.
        wait_seconds: How long a round waits for the answers before it goes on with the
            ones it has (default: ``timeout_seconds``, every answer).
        first_answer_seconds: How long a round that has no answer after ``wait_seconds``
            waits for the first one (mappers hold a call until they have rows): a short
            ``wait_seconds`` makes a round go on with the first mapper's rows, not come
            back empty while the rows are on their way.
    """

    def __init__(
        self,
        timeout_seconds: float,
        max_message_bytes: int,
        *,
        wait_seconds: float | None = None,
        first_answer_seconds: float = 0.1,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
    ) -> None:
        self._timeout = timeout_seconds
        self._wait = timeout_seconds if wait_seconds is None else wait_seconds
        self._first_answer = first_answer_seconds
        self._options = channel_options(max_message_bytes, server_name)
        self._credentials = credentials
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, millstream_pb2_grpc.MapperStub]] = {}
        self._holds: dict[str, _Hold] = {}
        self._under_way: dict[tuple[int, str, str, int], tuple[GetRowsCall, grpc.Future]] = {}
        self._acks: set[grpc.Future] = set()
        self._prefetched: set[tuple[int, str, str, int]] = set()
        """Calls :meth:`prefetch` started since the last round: waited for as its own."""
        self._answered_at: dict[grpc.Future, float] = {}
        self._answers_lock = threading.Lock()
        self.first_answer_at: float | None = None
        """When the first of the last :meth:`get_rows_many`'s answers came (monotonic
        seconds), None if it took none."""

    def _stub(self, address: str) -> millstream_pb2_grpc.MapperStub:
        with self._lock:
            entry = self._channels.get(address)
            if entry is None:
                channel = (
                    grpc.insecure_channel(address, options=self._options)
                    if self._credentials is None
                    else grpc.secure_channel(address, self._credentials, options=self._options)
                )
                entry = (channel, millstream_pb2_grpc.MapperStub(channel))
                self._channels[address] = entry
            return entry[1]

    def _keep_held(self, address: str, stub: millstream_pb2_grpc.MapperStub) -> None:
        """Keep a Hold call under way on ``address``'s channel.

        gRPC's synchronous client polls a channel's events on a thread it starts whenever a
        call begins on a channel without one under way, and that thread ends with the
        channel's last call; a reducer's calls come one round after another, so every
        GetRows would start (and end) a thread: about a tenth of a reducer's CPU at half of
        peak load. A call the mapper holds keeps the channel's thread for all of them.
        """
        with self._lock:
            hold = self._holds.get(address)
            if hold is None:
                hold = self._holds[address] = _Hold()
            if not hold.due(time.monotonic()):
                return
            hold.future = stub.Hold.future(
                millstream_pb2.HoldRequest(hold_ms=round(HOLD_SECONDS * 1000)),
                timeout=HOLD_SECONDS + self._timeout,
            )
            hold.future.add_done_callback(hold.ended)

    def _start(self, call: GetRowsCall) -> grpc.Future:
        request = millstream_pb2.GetRowsRequest(
            count=call.max_rows,
            reducer_index=call.reducer_index,
            committed_row_index=call.committed_row_index,
            mapper_guid=call.mapper_guid,
            max_bytes=call.max_bytes,
            wait_ms=round(call.wait_seconds * 1000),
            gather_rows=call.gather_rows,
            start_in_ms=round(call.start_in_seconds * 1000),
        )
        if call.after_row_index is not None:
            request.after_row_index = call.after_row_index
        request.shuffle_indices = call.shuffle_indices
        stub = self._stub(call.address)
        self._keep_held(call.address, stub)
        future: grpc.Future = stub.GetRows.future(request, timeout=self._timeout)
        future.add_done_callback(self._answered)
        return future

    def _answered(self, future: grpc.Future) -> None:
        if not future.cancelled():
            with self._answers_lock:
                self._answered_at[future] = time.monotonic()

    @staticmethod
    def _result(call: GetRowsCall, future: grpc.Future) -> GetRowsResult:
        try:
            response = future.result()
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                # The server names no instance; the caller knows which one it asked for.
                raise StaleMapperError(
                    f"mapper {call.mapper_index} instance {call.mapper_guid} at "
                    f"{call.address}: {exc.details() or 'stale mapper id'}"
                ) from None
            raise
        return GetRowsResult(
            response.row_count,
            response.last_shuffle_row_index,
            response.arrow_ipc,
            response.behind,
            response.input_ended,
        )

    def get_rows_many(self, calls: Sequence[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        """Ask every mapper (or keep the call under way to it) and wait at most
        ``wait_seconds`` for the answers to the calls made now; a slot of a call still
        under way holds :class:`NotAnsweredYet`."""
        wanted = {call.key for call in calls}
        for key, (_, future) in list(self._under_way.items()):
            if key not in wanted:  # an instance gone from discovery, or a drained mapper
                future.cancel()
                del self._under_way[key]
        entries = []
        fresh = []  # calls made for this round: the only ones the round waits for
        prefetched, self._prefetched = self._prefetched, set()
        for call in calls:
            entry = self._under_way.get(call.key)
            if entry is not None and not call.continues(entry[0]):
                entry[1].cancel()  # its answer would not continue from the reducer's position
                entry = None
            if entry is None:
                entry = (call, self._start(call))
                self._under_way[call.key] = entry
                fresh.append(entry[1])
            elif call.key in prefetched:
                fresh.append(entry[1])
            entries.append(entry)
        # A mapper that did not answer in an earlier round is not waited for again (a frozen
        # one would add the wait to every round); its answer is taken when it is there.
        # A call gathering a backlog is held by its mapper on purpose: wait for it.
        wait = max(
            [self._wait]
            + [c.wait_seconds + _GATHER_MARGIN_SECONDS for c in calls if c.gather_rows > 0]
        )
        deadline = time.monotonic() + wait
        for future in fresh:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                future.exception(timeout=left)
            except grpc.FutureTimeoutError:
                break
            except grpc.FutureCancelledError:
                pass
        if entries and not any(future.done() for _, future in entries):
            self._wait_for_any([future for _, future in entries], max(wait, self._first_answer))
        results: list[GetRowsResult | BaseException] = []
        self.first_answer_at = None
        for call, (_, future) in zip(calls, entries, strict=True):
            if not future.done():
                results.append(NotAnsweredYet(f"mapper {call.mapper_index} has not answered yet"))
                continue
            self._under_way.pop(call.key, None)
            with self._answers_lock:
                answered = self._answered_at.pop(future, None)
            if answered is not None and (
                self.first_answer_at is None or answered < self.first_answer_at
            ):
                self.first_answer_at = answered
            try:
                results.append(self._result(call, future))
            except Exception as exc:
                results.append(exc)
        with self._answers_lock:  # answers no round will take (their calls were dropped)
            under_way = {future for _, future in self._under_way.values()}
            for future in [f for f in self._answered_at if f not in under_way]:
                del self._answered_at[future]
        return results

    def wait_for_answer(self, timeout_seconds: float) -> None:
        """Return once a call under way is answered, at most ``timeout_seconds`` later: a
        reducer whose round found nothing to commit sleeps on its calls, which its mappers
        hold until they have rows, instead of for a fixed time while rows may be arriving.

        Only calls still unanswered when the wait starts end it: an answer already there
        that no round takes (a round without calls, its mappers gone from discovery) would
        otherwise end every wait at once, a busy loop."""
        waiting = [future for _, future in self._under_way.values() if not future.done()]
        if waiting:
            self._wait_for_any(waiting, timeout_seconds)
        else:
            time.sleep(timeout_seconds)

    @staticmethod
    def _wait_for_any(futures: list[grpc.Future], timeout: float) -> None:
        """Wait until one of ``futures`` is done, at most ``timeout`` seconds: with nothing
        to commit, the round sleeps on its calls instead of polling them."""
        done = threading.Event()
        for future in futures:
            future.add_done_callback(lambda _: done.set())
        done.wait(timeout)

    def prefetch(self, calls: Sequence[GetRowsCall]) -> None:
        """Start the calls (or keep the ones under way that continue from the same start)
        without waiting; the next :meth:`get_rows_many` takes their answers, and waits for
        the ones started here as for calls of its own."""
        for call in calls:
            entry = self._under_way.get(call.key)
            if entry is not None and call.continues(entry[0]):
                continue
            if entry is not None:
                entry[1].cancel()
            self._under_way[call.key] = (call, self._start(call))
            self._prefetched.add(call.key)

    def acknowledge_many(self, calls: Sequence[GetRowsCall]) -> None:
        """Send 0-row calls reporting committed indices, without waiting for them."""
        for call in calls:
            future = self._start(call)
            with self._lock:
                self._acks.add(future)
            future.add_done_callback(self._ack_done)

    def _ack_done(self, future: grpc.Future) -> None:
        with self._lock:
            self._acks.discard(future)

    def close(self) -> None:
        """Cancel the calls under way and close every channel."""
        for _, future in self._under_way.values():
            future.cancel()
        self._under_way.clear()
        with self._lock:
            channels, self._channels = self._channels, {}
            acks, self._acks = self._acks, set()
            holds, self._holds = self._holds, {}
        for future in acks:
            future.cancel()
        for hold in holds.values():
            if hold.future is not None:
                hold.future.cancel()
        for channel, _ in channels.values():
            channel.close()


class _Hold:
    """The Hold call of one channel: under way, or when the next may start."""

    def __init__(self) -> None:
        self.future: grpc.Future | None = None
        self._retry_at = 0.0
        """When the next may start (never: the mapper does not know the method)."""

    def due(self, now: float) -> bool:
        """Whether to start a Hold call now (none under way, the mapper serves them)."""
        if self.future is not None and not self.future.done():
            return False
        return now >= self._retry_at

    def ended(self, future: grpc.Future) -> None:
        """The call ended: the next starts with the channel's next call, at once if the
        mapper answered it, a while later if it failed (mapper down) or the mapper holds
        as many as it keeps threads for, never if the mapper does not know the method (an
        older version): calls then start threads as before."""
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            return
        code = error.code() if isinstance(error, grpc.Call) else None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            wait = math.inf
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            wait = HOLD_SECONDS
        else:
            wait = _HOLD_RETRY_SECONDS
        self._retry_at = time.monotonic() + wait
