"""The heartbeat: a worker's discovery entry and published status, refreshed from a thread
of its own (thesis 4.5)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from millstream.exceptions import RetryableStoreError, StoreUnavailableError
from millstream.ledger import (
    Metric,
    WorkerInfo,
    register_worker,
    unregister_worker,
    write_worker_status,
)
from millstream.state import Store, StoreTransaction
from millstream.workers.clock import SYSTEM_CLOCK

if TYPE_CHECKING:
    pass

log = logging.getLogger("millstream.workers")


class Heartbeat:
    """Registers a worker in discovery and publishes its status, from its own thread.

    A thread (rather than the worker loop) keeps the worker visible while ``map`` or
    ``reduce`` runs long or the mapper waits for memory. The first beat registers the
    instance (a new registration number, which makes it the current instance of its
    index, and removes the entries it supersedes); later beats advance its beat counter,
    and re-create the entry under the same registration if an observer removed it.
    """

    def __init__(
        self,
        store: Store,
        role: str,
        index: int,
        guid: str,
        address: str,
        period: float,
        metrics: Callable[[], dict[str, Metric]],
    ) -> None:
        self._store = store
        self._registration: int | None = None
        self._beats: int | None = None
        self._role, self._index, self._guid, self._address = role, index, guid, address
        self._period = period
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Register (or refresh) the discovery entry and write the status once."""
        metrics = self._metrics()
        now = SYSTEM_CLOCK.wall()

        def write(txn: StoreTransaction) -> WorkerInfo:
            info = register_worker(
                txn,
                self._role,
                self._index,
                self._guid,
                self._address,
                now,
                registration=self._registration,
                beats=self._beats,
            )
            write_worker_status(txn, self._role, self._index, {**metrics, "time": now})
            return info

        try:
            # Idempotent: running it again after it landed only advances the beat counter
            # (and, on the first beat, the registration number) once more.
            info = self._store.transact(write, idempotent=True, max_retries=3)
            self._registration, self._beats = info.registration, info.beats
        except (RetryableStoreError, StoreUnavailableError) as exc:
            log.warning("%s %d: heartbeat failed: %s", self._role, self._index, exc)

    def start(self) -> None:
        """Beat now, then every period from a daemon thread."""
        self.beat()
        self._thread = threading.Thread(
            target=self._loop, name=f"heartbeat-{self._role}-{self._index}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            self.beat()

    def stop(self) -> None:
        """Stop beating, publish a last status and leave discovery."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.beat()
        try:
            self._store.transact(
                lambda txn: unregister_worker(txn, self._role, self._index, self._guid),
                idempotent=True,
                max_retries=3,
            )
        except (RetryableStoreError, StoreUnavailableError) as exc:
            log.warning("%s %d: leaving discovery failed: %s", self._role, self._index, exc)
