"""The mapper worker (thesis 4.3): one instance over one input partition, a thin loop
around its protocol steps.

The steps are plain methods (:meth:`~.ingest.Ingestion.ingest_once`,
:meth:`~.window_service.WindowService.handle_get_rows`,
:meth:`~.trim.InputTrim.trim_input_rows`, :meth:`~.straggler_spill.StragglerSpill.spill_stragglers`)
so that a simulation can drive them one by one; :meth:`MapperWorker.run` is the thin loop
around them.
"""

from __future__ import annotations

import logging
import threading

from millstream.backoff import Backoff
from millstream.exceptions import (
    MapperSupersededError,
    RetryableStoreError,
    SplitBrainError,
    StoreUnavailableError,
    UserCodeError,
)
from millstream.workers.mapper_worker.drain import MapperDrain
from millstream.workers.mapper_worker.ingest import Ingestion
from millstream.workers.mapper_worker.straggler_spill import StragglerSpill
from millstream.workers.mapper_worker.trim import InputTrim

log = logging.getLogger("millstream.mapper")


class MapperWorker(Ingestion, StragglerSpill, InputTrim, MapperDrain):
    """One mapper instance over one input partition (a mapper worker reading several
    partitions runs one of these per partition, :mod:`millstream.workers.serve`);
    :class:`~.instance.MapperInstance` says what it is given.
    """

    def close(self) -> None:
        """Wake anything waiting on the window and release the reader."""
        self._closed = True
        if self.window is not None:
            self.window.close()
        self._notify_rows()
        self.reader.close()

    def metrics(self) -> dict[str, float | int | str]:
        """Status figures for ``millstream status``."""
        window = self.window.snapshot() if self.window is not None else None
        return {
            "guid": self.guid,
            "rows_read": self.rows_read,
            "rows_shuffled": self.rows_shuffled,
            "batches": self.batches,
            "dead_letters": self.dead_letters,
            "input_end_row_index": window.input_end_row_index if window else 0,
            "input_unread_row_index": window.input_unread_row_index if window else 0,
            "persisted_input_unread_row_index": self.persisted.input_unread_row_index,
            "shuffle_unread_row_index": window.shuffle_unread_row_index if window else 0,
            "window_rows": window.buffered_rows if window else 0,
            "window_bytes": window.buffered_bytes if window else 0,
            "window_entries": window.num_entries if window else 0,
            "shuffle_end_row_index": window.shuffle_end_row_index if window else 0,
            "memory_limit_bytes": self.memory_limit_bytes,
            "spills": self.spills,
            "rows_spilled": self.rows_spilled,
            "bytes_spilled": self.bytes_spilled,
            "end_of_input": int(self.end_of_input),
            "uptime": self.clock.now() - self.started_at,
            "errors": self.errors,
            "last_error": self.last_error[:500],
        }

    def run(self, stop: threading.Event) -> None:
        """Ingest until drained or stopped: the thin loop around the protocol steps.

        Store errors skip to the next iteration after a back-off (thesis 4.3.3 step 3);
        split brain restarts ingestion from the persisted state after a delay. A ``map``
        that raises stops the worker (``on_user_error="stop"``; with ``"dead_letter"``, one
        that cannot be split into dead letters or passes their cap) or is retried.

        At least once, a split brain ends the worker instead: an instance superseded by a
        newer one returns (the newer one goes on), and any other split brain is raised, so
        that the runner starts a new instance (a new GUID: rows served from the old window
        can then never be committed under the new numbering).
        """
        t = self.tuning
        backoff = Backoff(t.backoff_seconds, t.backoff_max_seconds)
        while not stop.is_set():
            try:
                self.start_ingestion()
                self._ingest_loop(stop, backoff)
                return
            except MapperSupersededError as exc:
                self._note_error(exc)
                return
            except SplitBrainError as exc:
                self._note_error(exc)
                if self.processor.at_least_once:
                    raise
                self.clock.sleep(t.split_brain_delay_seconds, stop)
            except UserCodeError as exc:
                if t.on_user_error != "retry":
                    raise
                self._note_error(exc)
                self.clock.sleep(backoff.next(), stop)
            except (RetryableStoreError, StoreUnavailableError) as exc:
                self._note_error(exc)
                self.clock.sleep(backoff.next(), stop)

    def _ingest_loop(self, stop: threading.Event, backoff: Backoff) -> None:
        t = self.tuning
        last_trim = self.clock.now()
        # Woken by appends, a reader that can wait for rows needs its timeout only for a
        # lost wake: an idle mapper looks at its partition less and less often.
        idle = Backoff(t.idle_seconds, max(t.idle_seconds, min(0.1, t.trim_period_seconds)))
        while not stop.is_set():
            progressed = False
            if not self.end_of_input:
                try:
                    progressed = self.ingest_once()
                    backoff.reset()
                except (RetryableStoreError, StoreUnavailableError) as exc:
                    self._note_error(exc)
                    self.clock.sleep(backoff.next(), stop)
                    continue
            window = self._require_window()  # a new one if ingestion restarted
            while True:
                # Room for a batch like the recent ones (and a quarter more: sizes vary),
                # so that the next one keeps the window under its limit.
                reserve = max(self._entry_bytes, default=0) * 5 // 4
                room = window.wait_for_room(min(0.1, t.trim_period_seconds), reserve)
                if not room:
                    try:
                        self.spill_stragglers()
                    except (RetryableStoreError, StoreUnavailableError) as exc:
                        self._note_error(exc)
                now = self.clock.now()
                drained_window = self.end_of_input and window.snapshot().num_entries == 0
                if now - last_trim >= t.trim_period_seconds or drained_window:
                    last_trim = now
                    try:
                        self.trim_input_rows()
                    except (RetryableStoreError, StoreUnavailableError) as exc:
                        self._note_error(exc)
                if room or stop.is_set():
                    break
            if self.is_drained():
                self.mark_drained()
                return
            if progressed:
                idle.reset()
            if not progressed or self.caught_up:
                # A read that took the partition's last rows waits for the next append
                # instead of reading again at once, to find nothing.
                self._wait_for_input(stop, idle)
