"""GetRows as plain data, and the two interfaces around it.

:class:`RowsHandler` serves GetRows (the mapper worker); :class:`RowsClient` makes the
calls (the reducer worker). gRPC implements both sides for real runs; in-process versions
let a simulation drive mappers and reducers step by step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

GET_ROWS_ENVELOPE_BYTES = 64
"""Bytes a ``GetRowsResponse`` takes besides its Arrow IPC payload: the tags and varints of
its four fields (at most 35 bytes), with room to spare."""


def max_payload_bytes(max_message_bytes: int) -> int:
    """The longest Arrow IPC payload a GetRows response can carry within a gRPC message of
    ``max_message_bytes``."""
    return max(0, max_message_bytes - GET_ROWS_ENVELOPE_BYTES)


@dataclass(frozen=True)
class GetRowsCall:
    """One GetRows request to one mapper instance.

    Attributes:
        mapper_index: The mapper's index.
        address: ``host:port`` of its gRPC server.
        mapper_guid: The instance's GUID from discovery; a mismatch is rejected.
        reducer_index: The calling reducer.
        committed_row_index: Last shuffle index the reducer committed from this mapper.
        max_rows: Row cap of the response.
        max_bytes: Byte cap of the response.
        wait_seconds: With no rows ready, how long the mapper may hold the call for rows
            to arrive (0: answer at once).
        gather_rows: A reducer folding a backlog: the mapper holds the call (at most
            ``wait_seconds``) until this many rows wait for the reducer, it has caught up
            with its input, or its window is half full (0: answer when any row is ready).
        after_row_index: The reducer's fetch position when it keeps fetched rows pending
            across commits (a queue reducer): rows come from after it, and the rows up to
            it stay in the mapper's window until committed (None: after the committed
            index).
        shuffle_indices: Return each row's shuffle index too (the last column,
            ``_core.SHUFFLE_INDEX_COLUMN``), so that a queue reducer can commit any prefix.
        start_in_seconds: The reducer's round that takes the answer starts this long
            after the call: the mapper takes note of ``committed_row_index`` at once and
            answers no sooner (0: at once).
    """

    mapper_index: int
    address: str
    mapper_guid: str
    reducer_index: int
    committed_row_index: int
    max_rows: int
    max_bytes: int
    wait_seconds: float = 0.0
    gather_rows: int = 0
    after_row_index: int | None = None
    shuffle_indices: bool = False
    start_in_seconds: float = 0.0

    @property
    def start(self) -> int:
        """The shuffle index the answer's rows come after: the fetch position, or the
        committed index without one. Two calls to one mapper instance from one reducer
        with the same start (and ``shuffle_indices``) get the same rows."""
        if self.after_row_index is None:
            return self.committed_row_index
        return max(self.committed_row_index, self.after_row_index)

    @property
    def key(self) -> tuple[int, str, str, int]:
        """Calls to one mapper instance from one reducer: at most one is under way."""
        return (self.mapper_index, self.address, self.mapper_guid, self.reducer_index)

    def continues(self, earlier: GetRowsCall) -> bool:
        """Whether the answer to ``earlier`` serves this call: the same mapper instance,
        the same rows after the same start, in the same form (the caps may differ)."""
        return (
            earlier.key == self.key
            and earlier.start == self.start
            and earlier.shuffle_indices == self.shuffle_indices
        )


@dataclass(frozen=True)
class GetRowsResult:
    """A mapper's answer: rows after the committed index, as one Arrow IPC stream.

    ``behind``: the mapper's last read filled a whole batch, so more rows follow at once.
    ``input_ended``: the mapper read the whole of its bounded input, and these are the last
    of its rows for the reducer after the reducer's position (nothing more will come).
    """

    row_count: int
    last_shuffle_row_index: int
    arrow_ipc: bytes
    behind: bool = False
    input_ended: bool = False


class NotAnsweredYet(TimeoutError):
    """The mapper has not answered within the round's wait; the call stays under way and its
    answer is used in a later round (it is not an error, and nothing is sent again)."""


class RowsClient(Protocol):
    """How a reducer calls its mappers; gRPC here, in-process in simulations."""

    first_answer_at: float | None
    """When the first answer the last :meth:`get_rows_many` took came (monotonic seconds),
    or None (none taken, or a client that does not know)."""

    def get_rows_many(self, calls: Sequence[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        """Run the calls concurrently; each slot holds the result or the error
        (:class:`NotAnsweredYet` for a call still under way)."""
        ...

    def acknowledge_many(self, calls: Sequence[GetRowsCall]) -> None:
        """Send 0-row calls that only report committed indices; nobody waits for them and
        their failures are harmless (the next GetRows repeats the index)."""
        ...

    def prefetch(self, calls: Sequence[GetRowsCall]) -> None:
        """Start the calls without waiting: the next :meth:`get_rows_many` call to the same
        mapper instance with the same :attr:`~GetRowsCall.start` takes the answer, and
        waits for it as for a call of its own (a reducer sends its next round's calls
        right after a commit, answered when the round starts; a pipelined one fetches its
        next rows while it commits)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@runtime_checkable
class AnswerWaiter(Protocol):
    """A :class:`RowsClient` whose calls stay under way between rounds (a mapper holds a
    call until it has rows), and that can wait for their answers."""

    def wait_for_answer(self, timeout_seconds: float) -> None:
        """Return once a call under way unanswered so far is answered, at most
        ``timeout_seconds`` later (that long when there is none)."""
        ...


@runtime_checkable
class RowsWaiter(Protocol):
    """A handler that can also wait for rows (a GetRows that found none may wait)."""

    def wait_for_rows(
        self, reducer_index: int, timeout_seconds: float, after_row_index: int | None = None
    ) -> bool:
        """Wait until rows for ``reducer_index`` (after ``after_row_index``, if given) may
        be ready, at most ``timeout_seconds``; returns whether to look again."""
        ...


@runtime_checkable
class RowsGatherer(Protocol):
    """A handler that can hold a reducer's call while a backlog gathers (the mapper)."""

    @property
    def behind(self) -> bool:
        """Whether the last read filled a whole batch (more input is ready at once)."""
        ...

    def gather(
        self,
        reducer_index: int,
        min_rows: int,
        timeout_seconds: float,
        after_row_index: int | None = None,
    ) -> None:
        """Return when ``min_rows`` rows wait for ``reducer_index`` (after
        ``after_row_index``, if given), the mapper is no longer behind, its window is half
        full, or ``timeout_seconds`` have passed."""
        ...


@runtime_checkable
class RowsEnd(Protocol):
    """A handler that knows when a reducer has fetched the last of its rows (the mapper)."""

    def fetched_all(self, reducer_index: int, after_row_index: int) -> bool:
        """Whether the whole (bounded) input was read and no row for ``reducer_index``
        follows ``after_row_index``."""
        ...


class RowsHandler(Protocol):
    """What serves GetRows (the mapper worker)."""

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
        """Thesis 4.3.4; returns (row_count, last_shuffle_row_index, Arrow IPC). Rows come
        from after ``after_row_index`` when given (a reducer's fetch position), with their
        shuffle indices as a last column when ``shuffle_indices``."""
        ...
