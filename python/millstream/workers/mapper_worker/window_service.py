"""The mapper's side of GetRows (thesis 4.3.4), served from gRPC threads while the
ingestion thread reads, maps and restarts the window.

**Threads.** The state those threads share is one immutable :class:`ServingState`: the
window, the claims made against that window (:mod:`millstream.workers.fencing`) and whether
the input ended. It is never changed field by field: the ingestion thread builds a new
object and swaps it in whole, only in :meth:`WindowService._swap`, under the lock that also
wakes the calls waiting for rows. A reader takes the current object once and decides from
it alone, without a lock: a GetRows records its claim in the claims of the very window it
pops, and :meth:`~WindowService.fetched_all` reads the end of input and the bucket from
one state.

A new window always comes with new, empty claims: a claim can never be recorded against
one window and cleared with another's, and the state the mapper persists (a window's local
state) is checked against the claims of that same window. A call that started on a window
that was replaced meanwhile pops only that discarded window.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from millstream import _core
from millstream.exceptions import StaleMapperError
from millstream.workers.clock import Clock
from millstream.workers.fencing import Claims


@dataclasses.dataclass(frozen=True)
class ServingState:
    """What GetRows is served from, swapped whole (never changed in place).

    Attributes:
        window: The window (None before ingestion starts).
        claims: The claims recorded against this window, and only this one (the object is
            thread-safe and grows; it is never shared with another window).
        end_of_input: Whether the bounded input was read to its end into this window.
    """

    window: _core.Window | None = None
    claims: Claims = dataclasses.field(default_factory=Claims)
    end_of_input: bool = False


class WindowService:
    """GetRows served from one mapper instance's window: the base of
    :class:`~millstream.workers.mapper_worker.MapperWorker`, which reads the input into it.

    Args:
        index: The mapper's index (its input partition).
        guid: This instance's GUID; calls naming another are refused.
        num_reducers: Reducers of the processor.
        clock: Time source.
    """

    def __init__(self, index: int, guid: str, num_reducers: int, clock: Clock) -> None:
        self.index = index
        self.guid = guid
        self.clock = clock
        self._num_reducers = num_reducers
        self._serving = ServingState()
        self._rows_pushed = threading.Condition()
        """Notified when rows enter the window (and when the state is swapped or closes);
        also the lock the state is swapped under."""
        self._closed = False
        self.behind = False
        """Whether the last read filled a whole batch: more input is ready at once, so the
        reducers may gather rows into fewer, larger commits (:meth:`gather`). A hint only:
        exactly-once never depends on it."""
        self._last_call = [clock.now()] * num_reducers
        """When each reducer last called GetRows (at both ends of a held call)."""

    # -- the shared state ----------------------------------------------------------------

    @property
    def window(self) -> _core.Window | None:
        """The window now (None before ingestion starts)."""
        return self._serving.window

    @window.setter
    def window(self, window: _core.Window | None) -> None:
        """Install a new window: with it come new, empty claims, and its input has not
        ended."""
        self._swap(lambda _: ServingState(window))

    @property
    def end_of_input(self) -> bool:
        """Whether the bounded input was read to its end into the current window."""
        return self._serving.end_of_input

    @end_of_input.setter
    def end_of_input(self, ended: bool) -> None:
        self._swap(lambda state: dataclasses.replace(state, end_of_input=ended))

    @property
    def claims(self) -> Claims:
        """The claims recorded against the current window."""
        return self._serving.claims

    @property
    def serving(self) -> ServingState:
        """The current state, to read several of its parts consistently."""
        return self._serving

    def _swap(self, change: Callable[[ServingState], ServingState]) -> None:
        """The only place the shared state changes: replace it whole, under the lock, and
        wake the calls waiting on the window."""
        with self._rows_pushed:
            self._serving = change(self._serving)
            self._rows_pushed.notify_all()

    # -- GetRows -------------------------------------------------------------------------

    def handle_get_rows(
        self,
        reducer_index: int,
        committed_row_index: int,
        max_rows: int,
        max_bytes: int,
        mapper_guid: str,
        *,
        after_row_index: int | None = None,
        shuffle_indices: bool = False,
    ) -> tuple[int, int, bytes]:
        """Serve one GetRows; trims window entries as a side effect (TrimWindowEntries).
        Rows come from after ``after_row_index`` when given (the reducer's fetch position),
        with their shuffle indices as a last column when ``shuffle_indices``.

        Raises:
            StaleMapperError: ``mapper_guid`` is not this instance's GUID (the message names
                no instance: the GUID is what lets a caller in).
            ValueError: ``reducer_index`` is not a reducer of the processor.
        """
        if mapper_guid != self.guid:
            raise StaleMapperError(
                f"GetRows for mapper {self.index} named an instance that does not serve it: "
                "the caller's discovery entry is stale; refresh discovery"
            )
        if not 0 <= reducer_index < self._num_reducers:
            raise ValueError(
                f"GetRows for reducer {reducer_index}: mapper {self.index} serves reducers 0 "
                f"to {self._num_reducers - 1}; the caller is not a reducer of this processor"
            )
        state = self._serving  # one state: the claim goes with the window it pops
        window = state.window
        if window is None:
            return 0, committed_row_index, b""
        state.claims.record(reducer_index, committed_row_index)
        self._last_call[reducer_index] = self.clock.now()
        return window.get_rows(
            reducer_index,
            committed_row_index,
            max_rows,
            max_bytes,
            after_row_index,
            shuffle_indices,
        )

    def fetched_all(self, reducer_index: int, after_row_index: int) -> bool:
        """Whether the whole (bounded) input is read and the window holds no row for
        ``reducer_index`` after ``after_row_index``: that reducer has everything. In a
        rescale's run the input ends at the rescale's cut, and the reducers, which know
        they are rescaling, hand over there instead of ending."""
        state = self._serving  # the end of input of this window, not of one before
        window = state.window
        if not state.end_of_input or window is None:
            return False
        if not 0 <= reducer_index < self._num_reducers:
            return False
        return window.bucket_len(reducer_index, after_row_index) == 0

    def wait_for_rows(
        self, reducer_index: int, timeout_seconds: float, after_row_index: int | None = None
    ) -> bool:
        """Wait until the window holds rows for ``reducer_index`` (after
        ``after_row_index``, if given), at most ``timeout_seconds``: a GetRows that found
        none answers as soon as some arrive instead of the reducer polling. Returns whether
        to look again."""
        window = self.window
        if window is None or not 0 <= reducer_index < self._num_reducers:
            return False
        return self._wait_on_window(
            window, lambda: window.bucket_len(reducer_index, after_row_index) > 0, timeout_seconds
        )

    def gather(
        self,
        reducer_index: int,
        min_rows: int,
        timeout_seconds: float,
        after_row_index: int | None = None,
    ) -> None:
        """Hold a reducer's GetRows while its backlog gathers: return once ``min_rows`` rows
        wait for ``reducer_index`` (after ``after_row_index``: a pipelined reducer's fetch
        position, past the rows it is committing), this mapper has caught up with its input
        (no longer :attr:`behind`), its window is half full (reading must not stall on the
        memory limit), or ``timeout_seconds`` have passed. A reducer that is behind thus
        commits a few large batches instead of many small ones, as a micro-batch engine
        does."""
        window = self.window
        if window is None or not 0 <= reducer_index < self._num_reducers:
            return

        def gathered() -> bool:
            if not self.behind or window.bucket_len(reducer_index, after_row_index) >= min_rows:
                return True
            snapshot = window.snapshot()
            return 2 * snapshot.buffered_bytes >= snapshot.memory_limit_bytes

        self._wait_on_window(window, gathered, timeout_seconds)

    def _wait_on_window(
        self, window: _core.Window, ready: Callable[[], bool], timeout_seconds: float
    ) -> bool:
        """Wait, woken whenever rows are pushed, until ``ready()`` or the window is replaced
        (True), or this worker closes or ``timeout_seconds`` pass (False)."""
        deadline = time.monotonic() + timeout_seconds
        with self._rows_pushed:
            while not self._closed:
                if self.window is not window or ready():
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._rows_pushed.wait(left)
            return False

    def _notify_rows(self) -> None:
        with self._rows_pushed:
            self._rows_pushed.notify_all()
