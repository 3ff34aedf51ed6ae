"""A transaction that outlives the five-second limit by replaying itself into a new one.

A reducer's ``reduce`` runs user code with a transaction open. FoundationDB fails a
transaction older than five seconds (``transaction_too_old``; the client's timeout gives
``transaction_timed_out``), so a ``reduce`` that computes longer than that could never
commit: the reducer would fetch the same rows and fail the same way for ever.

:class:`ReplayingTransaction` records every operation made through it (reads with what
they returned, writes with their arguments, already encoded) and keeps a backend
transaction underneath only while it is young. When that transaction has been open for
more than half the limit, or fails as too old, a new one replaces it: every recorded
operation is replayed into it, in order, and every read that was conflict-checked
(not ``snapshot``) must return what it returned the first time, or the replay fails with
:class:`~millstream.exceptions.StoreConflictError`. The transaction that finally commits has
therefore read everything the user code read, with the same results, and is
conflict-checked on all of it, exactly as if the whole ``reduce`` had run inside it; the
time the user code spends computing between operations no longer counts. Only the store
operations themselves must fit in the limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from millstream.exceptions import StoreConflictError, TransactionTooOldError
from millstream.state.store import Store
from millstream.state.transaction import StoreTransaction

_WRITE = object()
"""The recorded result of a write (nothing to compare on replay)."""

_SNAPSHOT = object()
"""The recorded result of a snapshot read (not conflict-checked, so not re-read)."""


class ReplayingTransaction(StoreTransaction):
    """A transaction whose user code may run longer than the store's transaction limit.

    Args:
        store: The store to open the underlying transactions on.
        renew_after_seconds: Replace the underlying transaction once it is this old
            (default: half the store's time limit).
        splittable: As for :class:`StoreTransaction`.

    Attributes:
        renewals: How many times the underlying transaction was replaced.
    """

    def __init__(
        self,
        store: Store,
        *,
        renew_after_seconds: float | None = None,
        splittable: bool = False,
    ) -> None:
        super().__init__(store, splittable=splittable)
        self._open = store.create_transaction
        self._inner: StoreTransaction | None = None
        self._inner_started = 0.0
        self._log: list[tuple[str, tuple[Any, ...], Any]] = []
        limit = self._limits.max_transaction_seconds
        self._renew_after = limit / 2 if renew_after_seconds is None else renew_after_seconds
        self.renewals = 0

    def _start(self) -> None:
        # The age that matters is the underlying transaction's, checked in _current.
        if self._started is None:
            self._started = self._clock()

    def _fresh(self) -> StoreTransaction:
        inner = self._open()
        inner._start_write()  # its own commit checks its age (the SQLite store's limit)
        self._inner, self._inner_started = inner, self._clock()
        return inner

    def _current(self) -> StoreTransaction:
        if self._inner is None:
            return self._fresh()
        if self._clock() - self._inner_started > self._renew_after:
            self._renew()
            assert self._inner is not None
        return self._inner

    def _renew(self) -> None:
        """Replace the underlying transaction by a new one holding every recorded operation."""
        old, self._inner = self._inner, None
        if old is not None:
            old.reset()
        self.renewals += 1
        inner = self._fresh()
        try:
            for op, args, seen in self._log:
                result = getattr(inner, op)(*args)
                if seen is not _WRITE and seen is not _SNAPSHOT and result != seen:
                    raise StoreConflictError(
                        "what this transaction read changed while its user code ran (the "
                        f"transaction was renewed after {self._renew_after:g} s and its "
                        f"{op} returned something else); it is retried"
                    )
        except TransactionTooOldError as exc:
            raise TransactionTooOldError(
                f"replaying the {len(self._log)} reads and writes of this transaction into a "
                f"new one took longer than the {self._limits.max_transaction_seconds:g} s "
                "limit on their own: do fewer reads and writes per transaction (for a "
                f"reducer, fewer rows per commit). {exc}"
            ) from exc

    def _do(self, op: str, args: tuple[Any, ...], kind: Any) -> Any:
        inner = self._current()
        try:
            result = getattr(inner, op)(*args)
        except TransactionTooOldError:
            self._renew()
            assert self._inner is not None
            result = getattr(self._inner, op)(*args)
        self._log.append((op, args, result if kind is None else kind))
        return result

    # -- backend hooks ------------------------------------------------------------------

    def _raw_get(self, key: bytes, snapshot: bool) -> bytes | None:
        value: bytes | None = self._do("_raw_get", (key, snapshot), _SNAPSHOT if snapshot else None)
        return value

    def _raw_get_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]:
        values: list[bytes | None] = self._do(
            "_raw_get_many", (keys, snapshot), _SNAPSHOT if snapshot else None
        )
        return values

    def _raw_get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[tuple[bytes, bytes]]:
        rows: list[tuple[bytes, bytes]] = self._do(
            "_raw_get_range",
            (begin, end, limit, reverse, snapshot),
            _SNAPSHOT if snapshot else None,
        )
        return rows

    def _raw_set(self, key: bytes, value: bytes) -> None:
        self._do("_raw_set", (key, value), _WRITE)

    def _raw_set_many(self, keys: list[bytes], values: list[bytes]) -> None:
        self._do("_raw_set_many", (keys, values), _WRITE)

    def _raw_clear(self, key: bytes) -> None:
        self._do("_raw_clear", (key,), _WRITE)

    def _raw_clear_range(self, begin: bytes, end: bytes) -> None:
        self._do("_raw_clear_range", (begin, end), _WRITE)

    def _raw_add(self, key: bytes, delta: int) -> None:
        self._do("_raw_add", (key, delta), _WRITE)

    def _raw_add_many(self, keys: Sequence[bytes], deltas: list[int]) -> None:
        self._do("_raw_add_many", (keys, deltas), _WRITE)

    def _raw_add_lanes(self, keys: Sequence[bytes], deltas: list[bytes]) -> None:
        self._do("_raw_add_lanes", (keys, deltas), _WRITE)

    # -- lifecycle ----------------------------------------------------------------------

    def commit(self) -> None:
        """Commit the underlying transaction, renewed first if it is old.

        Raises:
            StoreConflictError: Something read changed (also: while the user code ran).
            TransactionTooOldError: The reads and writes alone take longer than the limit.
            CommitUnknownResultError, StoreUnavailableError: As :meth:`StoreTransaction.commit`.
        """
        self._raw_commit()
        self._committed()

    def _raw_commit(self) -> None:
        inner = self._current()
        try:
            inner.commit()
        except TransactionTooOldError:
            self._renew()
            assert self._inner is not None
            self._inner.commit()
        self._inner = None
        self._log = []

    def _raw_reset(self) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.reset()
        self._log = []


__all__ = ["ReplayingTransaction"]
