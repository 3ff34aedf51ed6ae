"""GetRows without a network: reducers call mapper handlers directly (simulations, tests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from millstream.rpc.calls import GetRowsCall, GetRowsResult, RowsHandler


class InProcessRowsClient:
    """A :class:`~millstream.rpc.calls.RowsClient` that calls handlers in this process.

    Args:
        resolve: Maps a discovery address to the handler serving it, or ``None`` when
            that mapper is down (the call then fails with ``ConnectionError``). A dict's
            ``get`` works.
    """

    def __init__(self, resolve: Callable[[str], RowsHandler | None]) -> None:
        self._resolve = resolve

    def get_rows_many(self, calls: Sequence[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        """Serve the calls one after another; errors are returned in their slots."""
        results: list[GetRowsResult | BaseException] = []
        for call in calls:
            handler = self._resolve(call.address)
            if handler is None:
                results.append(ConnectionError(f"mapper at {call.address} is down"))
                continue
            try:
                count, last, payload = handler.handle_get_rows(
                    call.reducer_index,
                    call.committed_row_index,
                    call.max_rows,
                    call.max_bytes,
                    call.mapper_guid,
                )
            except Exception as exc:
                results.append(exc)
                continue
            results.append(GetRowsResult(count, last, payload))
        return results

    def close(self) -> None:
        """Nothing to release."""
