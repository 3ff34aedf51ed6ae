"""What the broker alone costs to serve a topic's records: every partition fetched at once,
each by a client that only receives the responses' bytes (Kafka's Fetch v4,
``read_committed``, spoken with :mod:`socket` and :mod:`struct`: no decoding, no Arrow).

The time it takes is how long the broker needs to hand the records over when the client
costs nothing; the broker's CPU seconds meanwhile (from ``/proc``) are what any reader of
the topic makes it spend on this machine's cores, beside the job.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_FETCH, _VERSION = 1, 4
_BATCH_HEAD = struct.Struct(">qi")
"""A record batch's base offset and length (the length counts what follows it)."""
_LAST_OFFSET_DELTA = 23
"""Where a batch's last offset delta starts."""


@dataclass(frozen=True)
class BrokerAlone:
    """Every partition served whole: the seconds until the last byte came, the bytes and
    the broker's CPU seconds meanwhile."""

    seconds: float
    bytes: int
    broker_cpu_seconds: float


def serve_all(
    bootstrap: str,
    topic: str,
    ends: list[int],
    broker_cpu: Callable[[], float],
    fetch_bytes: int = 8 << 20,
) -> BrokerAlone:
    """Fetch partitions ``0..len(ends)`` of ``topic`` from offset 0 to ``ends[p]``, all at
    once (a thread and a connection each)."""
    host, port = bootstrap.rsplit(":", 1)
    received = [0] * len(ends)
    failures: list[BaseException] = []

    def run(partition: int) -> None:
        try:
            with socket.create_connection((host, int(port)), timeout=60) as sock:
                received[partition] = _fetch_partition(
                    sock, topic, partition, ends[partition], fetch_bytes
                )
        except BaseException as exc:  # reported by the caller
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(len(ends))]
    cpu, started = broker_cpu(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if failures:
        raise failures[0]
    return BrokerAlone(seconds, sum(received), broker_cpu() - cpu)


def _fetch_partition(
    sock: socket.socket, topic: str, partition: int, end: int, fetch_bytes: int
) -> int:
    """Fetch from offset 0 until ``end``; returns the bytes received."""
    offset, total, correlation = 0, 0, 0
    name = topic.encode()
    while offset < end:
        correlation += 1
        body = struct.pack(">hhih", _FETCH, _VERSION, correlation, 5) + b"bench"
        body += struct.pack(">iiiibi", -1, 100, 1, fetch_bytes, 1, 1)
        body += struct.pack(">h", len(name)) + name
        body += struct.pack(">iiqi", 1, partition, offset, fetch_bytes)
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _exactly(sock, 4))
        response = _exactly(sock, size)
        total += 4 + size
        offset = _next_offset(response, name, offset)
    return total


def _next_offset(response: bytes, name: bytes, offset: int) -> int:
    """The offset after the whole record batches of a Fetch v4 response for one
    partition."""
    at = 4 + 4 + 4 + 2 + len(name) + 4 + 4  # correlation, throttle, topics, name, parts, id
    (error,) = struct.unpack_from(">h", response, at)
    if error:
        raise RuntimeError(f"Fetch failed with Kafka error code {error}")
    at += 2 + 8 + 8
    (aborted,) = struct.unpack_from(">i", response, at)
    at += 4 + max(aborted, 0) * 16
    (length,) = struct.unpack_from(">i", response, at)
    at, stop = at + 4, at + 4 + max(length, 0)
    while at + _BATCH_HEAD.size <= stop:
        base, size = _BATCH_HEAD.unpack_from(response, at)
        if at + 12 + size > stop:
            break
        (delta,) = struct.unpack_from(">i", response, at + _LAST_OFFSET_DELTA)
        offset = max(offset, base + delta + 1)
        at += 12 + size
    return offset


def _exactly(sock: socket.socket, n: int) -> bytearray:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        read = sock.recv_into(view[got:])
        if read == 0:
            raise ConnectionError("the broker closed the connection")
        got += read
    return buffer
