"""The store's retry loop: a transaction run again after a retryable error, with backoff.

:meth:`~millstream.state.store.Store.transact` runs here; a simulation calls
:func:`run_transaction` itself with a sleep that does not block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from millstream.backoff import exponential_delay, jittered
from millstream.exceptions import CommitUnknownResultError, RetryableStoreError

if TYPE_CHECKING:
    from millstream.state.transaction import StoreTransaction

T = TypeVar("T")

BACKOFF_BASE_SECONDS = 0.005
"""First retry delay of :meth:`Store.transact` (before jitter)."""

BACKOFF_CAP_SECONDS = 1.0
"""Largest retry delay of :meth:`Store.transact`."""

DEFAULT_MAX_RETRIES = 100
"""Retries :meth:`Store.transact` makes before it gives up and raises the last error."""


def backoff_delay(attempt: int) -> float:
    """Jittered exponential backoff: uniform in ``[c/4, c]``, c = min(cap, base * 2**attempt)."""
    return jittered(exponential_delay(BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS, attempt))


def run_transaction(
    create: Callable[[], StoreTransaction],
    fn: Callable[[StoreTransaction], T],
    *,
    idempotent: bool = False,
    max_retries: int | None = DEFAULT_MAX_RETRIES,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """The retry loop of :meth:`Store.transact`, on transactions made by ``create``.

    ``sleep`` waits between attempts (a simulation passes one that does not block).
    """
    attempt = 0
    while True:
        txn = create()
        try:
            result = fn(txn)
            txn.commit()
            return result
        except CommitUnknownResultError as exc:
            txn.reset()
            if not idempotent:
                name = getattr(fn, "__qualname__", repr(fn))
                raise CommitUnknownResultError(
                    f"{exc}. The transaction ({name}) may have been applied, and it is not "
                    "declared idempotent, so it was not run again (that could apply it "
                    "twice). Read whether its writes landed before running it again, or make "
                    "it idempotent (running it again after it landed must change nothing) "
                    "and pass transact(..., idempotent=True)"
                ) from exc
            if max_retries is not None and attempt >= max_retries:
                raise
        except RetryableStoreError:
            txn.reset()
            if max_retries is not None and attempt >= max_retries:
                raise
        except BaseException:
            txn.reset()
            raise
        sleep(backoff_delay(attempt))
        attempt += 1


__all__ = [
    "BACKOFF_BASE_SECONDS",
    "BACKOFF_CAP_SECONDS",
    "DEFAULT_MAX_RETRIES",
    "backoff_delay",
    "run_transaction",
]
