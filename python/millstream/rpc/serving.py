"""GetRows served: the one path from a request to its answer, whatever carried it.

The gRPC servicer (:mod:`millstream.rpc.server`) is a thin adapter over
:func:`serve_get_rows`, and so is the in-process transport of
:mod:`millstream.testing`: tests and simulations run the code production runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from millstream.exceptions import StaleMapperError
from millstream.rpc.calls import (
    GetRowsResult,
    RowsEnd,
    RowsGatherer,
    RowsHandler,
    RowsWaiter,
)

MAX_WAIT_SECONDS = 30.0
"""The longest a call may be held waiting for rows, whatever the request says."""


def route(handlers: RowsHandler | Mapping[str, RowsHandler], mapper_guid: str) -> RowsHandler:
    """The handler a call is for: the only one, or the mapper instance it names.

    Raises:
        StaleMapperError: No instance served here has that GUID. The message names none:
            a GUID is what lets a caller in, and the caller may be anyone who reaches the
            server.
    """
    if not isinstance(handlers, Mapping):
        return handlers
    handler = handlers.get(mapper_guid)
    if handler is None:
        raise StaleMapperError(
            "GetRows named a mapper instance that this server does not serve: the caller's "
            "discovery entry is stale; refresh discovery"
        )
    return handler


_NO_CAP = 2**63 - 1


def _always() -> bool:
    return True


def serve_get_rows(
    handler: RowsHandler,
    *,
    reducer_index: int,
    committed_row_index: int,
    max_rows: int,
    max_bytes: int,
    mapper_guid: str,
    after_row_index: int | None = None,
    shuffle_indices: bool = False,
    wait_seconds: float = 0.0,
    gather_rows: int = 0,
    start_in_seconds: float = 0.0,
    max_response_bytes: int | None = None,
    is_active: Callable[[], bool] = _always,
) -> GetRowsResult:
    """Answer one GetRows from ``handler`` (thesis 4.3.4, with the waits reducers ask for).

    Args:
        handler: The mapper instance the call is for (:func:`route`).
        reducer_index: The calling reducer.
        committed_row_index: The last shuffle index it committed from this mapper.
        max_rows: Row cap of the answer (0: only acknowledge ``committed_row_index``).
        max_bytes: Byte cap the caller asks for (0: the server's).
        mapper_guid: The instance GUID the call names.
        after_row_index: The caller's fetch position, if it keeps rows across commits.
        shuffle_indices: Return each row's shuffle index as a last column.
        wait_seconds: With no rows ready, how long the call may be held for some (at most
            :data:`MAX_WAIT_SECONDS`; 0 in process, where a call is never held).
        gather_rows: Hold the call while a backlog of this many rows gathers.
        start_in_seconds: Acknowledge now, answer no sooner than this.
        max_response_bytes: The server's byte cap (None: none, in process).
        is_active: Whether the caller still waits for the answer.

    Raises:
        StaleMapperError: ``mapper_guid`` is not the instance's GUID.
        CommittedIndexError: The committed index went backwards or is invalid.
        ValueError: Another argument is out of range (a reducer index, a byte cap).
    """
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0 (0: the server's cap), got {max_bytes}")
    cap = _NO_CAP if max_response_bytes is None else max_response_bytes
    max_bytes = min(max_bytes or cap, cap)
    wait = max(0.0, wait_seconds) if max_rows > 0 else 0.0
    start_in = min(max(0.0, start_in_seconds), MAX_WAIT_SECONDS) if max_rows > 0 else 0.0
    start = time.monotonic() + start_in
    deadline = start + min(wait, MAX_WAIT_SECONDS)
    # Passed only when set, so handlers that predate fetch positions keep working.
    after: dict[str, Any] = {} if after_row_index is None else {"after_row_index": after_row_index}
    options = dict(after)
    if shuffle_indices:
        options["shuffle_indices"] = True
    later = start > time.monotonic()  # the reducer's next round, not this moment
    gatherer = (  # a reducer folding a backlog: hold the call while it gathers
        handler if gather_rows > 0 and wait > 0 and isinstance(handler, RowsGatherer) else None
    )
    if later or gatherer is not None:
        # A call held before it is served acknowledges the committed index first (frees
        # memory, lets the mapper read on, persist and trim).
        handler.handle_get_rows(reducer_index, committed_row_index, 0, max_bytes, mapper_guid)
    while later and is_active() and (left := start - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
    if gatherer is not None:
        gatherer.gather(
            reducer_index,
            min(gather_rows, max(1, max_rows)),
            deadline - time.monotonic(),
            **after,
        )
    while True:
        count, last, payload = handler.handle_get_rows(
            reducer_index,
            committed_row_index,
            max(0, max_rows),
            max_bytes,
            mapper_guid,
            **options,
        )
        left = deadline - time.monotonic()
        if count or left <= 0 or not isinstance(handler, RowsWaiter):
            break
        if isinstance(handler, RowsEnd) and handler.fetched_all(reducer_index, last):
            break  # nothing more will come for this reducer: do not hold it
        if not is_active() or not handler.wait_for_rows(reducer_index, left, **after):
            break
    return GetRowsResult(
        count,
        last,
        payload if count else b"",
        isinstance(handler, RowsGatherer) and handler.behind,
        isinstance(handler, RowsEnd) and handler.fetched_all(reducer_index, last),
    )
