"""The store: a transactional ordered key-value store under a per-processor key prefix.

Backends (:mod:`millstream.state.sqlite`, :mod:`millstream.state.fdb_backend`) subclass
:class:`Store`; open one by URL with :func:`~millstream.state.open_store`.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import ClassVar, TypeVar

from millstream.exceptions import ConfigurationError
from millstream.state.keys import Key, pack
from millstream.state.limits import DEFAULT_LIMITS, StoreLimits
from millstream.state.retry import DEFAULT_MAX_RETRIES, run_transaction
from millstream.state.transaction import StoreTransaction

T = TypeVar("T")


class Store(ABC):
    """A transactional ordered key-value store under a per-processor key prefix.

    Open one with :func:`~millstream.state.open_store`. A store may be used from several
    threads (each transaction from one thread at a time) and pickled into child processes,
    which reopen it from its URL; no connection crosses a fork.

    Attributes:
        clock: Monotonic seconds, read to enforce the transaction time limit; the real
            clock unless a simulation replaces it (it is not pickled).
    """

    clock: Callable[[], float]

    limits_transaction_size: ClassVar[bool] = True
    """Whether the backend refuses a transaction past a size of its own (FoundationDB: 10 MB
    by its count). One that does not (SQLite) holds a splittable transaction only to its
    stored bytes (:attr:`StoreTransaction.commit_size`), every other one to FoundationDB's
    count."""

    def __init__(self, url: str, prefix: Key, limits: StoreLimits | None) -> None:
        if not isinstance(prefix, tuple):
            raise ConfigurationError(
                f"store prefix must be a tuple, e.g. ('wordcount',); got {prefix!r}"
            )
        self._url = url
        self._prefix = prefix
        self._prefix_bytes = pack(prefix)
        self._limits = limits or DEFAULT_LIMITS
        self.clock = time.monotonic

    @property
    def url(self) -> str:
        """The URL the store was opened from."""
        return self._url

    @property
    def prefix(self) -> Key:
        """The tuple every key of this store object lives under."""
        return self._prefix

    @property
    def prefix_bytes(self) -> bytes:
        """The packed prefix."""
        return self._prefix_bytes

    @property
    def limits(self) -> StoreLimits:
        """The limits enforced on every transaction."""
        return self._limits

    @abstractmethod
    def create_transaction(self) -> StoreTransaction:
        """Start a transaction; commit it with :meth:`StoreTransaction.commit`."""

    @abstractmethod
    def close(self) -> None:
        """Release connections. Transactions still open become unusable."""

    def wait_for(
        self, key: Key, until: Callable[[bytes | None], bool], timeout_seconds: float
    ) -> None:
        """Return once ``until(value of key)`` holds, or the key may have changed since the
        caller's last read (the last wait of this thread for ``key``, on the embedded
        store), or ``timeout_seconds`` passed, whichever comes first; the caller reads again.

        What a reader at the end of its input calls instead of polling: it wakes as soon as
        a writer's transaction commits (on the embedded store, a transaction that named the
        key with :meth:`StoreTransaction.wake_on_commit`). Here, for backends without
        notifications: one read, then a sleep through the timeout.
        """
        with self.read() as txn:
            if until(txn.get(key, snapshot=True)):
                return
        time.sleep(max(0.0, timeout_seconds))

    def _wake(self, keys: set[bytes]) -> None:
        """Wake the waiters of ``keys`` (packed), after a commit that wrote them; backends
        whose reads see other processes' commits by themselves do nothing."""
        return

    @contextlib.contextmanager
    def read(self) -> Iterator[StoreTransaction]:
        """A transaction to read in, reset when the block ends (it never commits).

        ``with store.read() as tr: state = read_mapper_state(tr, m)``. Writes made in it
        are dropped; use :meth:`transact` to write.
        """
        txn = self.create_transaction()
        try:
            yield txn
        finally:
            txn.reset()

    def transact(
        self,
        fn: Callable[[StoreTransaction], T],
        *,
        idempotent: bool = False,
        max_retries: int | None = DEFAULT_MAX_RETRIES,
    ) -> T:
        """Run ``fn`` in a new transaction and commit, retrying on retryable errors.

        Each attempt gets a fresh transaction, so ``fn`` must not keep state between calls
        (it may run several times). Conflicts and too-old errors are retried after a
        jittered exponential backoff; every other error propagates. A commit whose outcome
        is unknown (:class:`~millstream.exceptions.CommitUnknownResultError`: it may have
        been applied) is retried only when ``fn`` is declared idempotent; otherwise it is
        raised, since running ``fn`` again after it landed would apply it twice.

        Args:
            fn: Called with the transaction; its result is returned after the commit.
            idempotent: ``fn`` changes nothing when run again after an attempt that landed
                (it checks in the transaction whether its work is done, e.g. a sequence
                number it records, or only reads and overwrites with the same values).
            max_retries: Give up after this many retries and raise the last error; ``None``
                retries forever.

        Returns:
            What ``fn`` returned in the attempt that committed.

        Raises:
            CommitUnknownResultError: A commit's outcome is unknown and ``fn`` is not
                declared idempotent; the message says what to do.
        """
        return run_transaction(
            self.create_transaction, fn, idempotent=idempotent, max_retries=max_retries
        )

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Callable[..., Store], tuple[str, Key, StoreLimits]]:
        from millstream.state.url import open_store

        return open_store, (self._url, self._prefix, self._limits)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._url!r}, prefix={self._prefix!r})"


__all__ = ["Store"]
