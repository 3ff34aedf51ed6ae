"""One reducer instance's state: what it was given, what it counts, and what the steps of
its rounds keep between them (the parts only a queue reducer keeps are its
:class:`~.queue_round.QueueRound`'s)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from millstream.ledger import REDUCER_ACTIVITIES, ReducerState
from millstream.queue_reducer import QueueReducer
from millstream.rpc.calls import RowsClient
from millstream.state import Store
from millstream.workers.clock import SYSTEM_CLOCK, Clock
from millstream.workers.discovery_view import DiscoveryView
from millstream.workers.reducer_worker.cadence import CommitCadence
from millstream.workers.reducer_worker.fetch_sizing import FetchSizing
from millstream.workers.reducer_worker.queue_round import QueueRound
from millstream.workers.reducer_worker.settling import UnsettledOutputs
from millstream.workers.status_report import TimeSpent

if TYPE_CHECKING:
    from millstream.processor import Processor

log = logging.getLogger("millstream.reducer")


class ReducerInstance:
    """One reducer instance.

    Args:
        processor: The processor this reducer belongs to.
        index: The reducer's index.
        store: The processor's store.
        rows_client: How GetRows reaches the mappers.
        clock: Time source.
        guid: This instance's GUID (default: a new random one).
    """

    def __init__(
        self,
        processor: Processor,
        index: int,
        store: Store,
        rows_client: RowsClient,
        *,
        clock: Clock = SYSTEM_CLOCK,
        guid: str | None = None,
    ) -> None:
        self.processor = processor
        self.index = index
        self.store = store
        self.rows_client = rows_client
        self.clock = clock
        self.tuning = processor.tuning
        self.guid = guid or uuid.uuid4().hex
        self.spec = processor.spec("reducer", index, self.guid)
        self.user = processor.reducer(self.spec, processor.config)
        self.commits = 0
        self.rows_reduced = 0
        self.bytes_fetched = 0
        self.split_brains = 0
        self.superseded_fetches = 0
        """At least once: fetches not committed because their mapper instance was
        superseded."""
        self.rows_emitted = 0
        """Rows appended to output queues by committed transactions."""
        self.files_published = 0
        """Files published to output sinks by committed transactions."""
        self.dead_letters = 0
        """Rows committed as dead letters (``on_user_error="dead_letter"``)."""
        self.last_state: ReducerState | None = None
        self.all_drained = False
        self.rescaling = False
        """A rescale's run: the mappers' inputs end at its cut, which is not their end."""
        self.errors = 0
        self.last_error = ""
        self.started_at = clock.now()
        self.fetch_sizing = FetchSizing()
        self.last_commit_size = 0
        """The last commit's ``StoreTransaction.commit_size``: the next fetch's size follows it."""
        self.last_transaction_seconds = 0.0
        """How long the last committed transaction took, ``reduce`` included."""
        self.capped = False
        self.behind = True
        """Whether a mapper said in its last answer that it is behind its input (at start:
        assume so; the first answers tell)."""
        self._spill_pending = False
        """Whether the last view found rows spilled for this reducer in the store."""
        self._missing_since: float | None = None
        """When a gathering reducer first found an undrained mapper missing from discovery."""
        self.renewals = 0
        self.time_spent = TimeSpent(*REDUCER_ACTIVITIES)
        """Where this reducer's time goes (``millstream status``)."""
        self.cadence = CommitCadence(self.tuning)
        """When the next round may start after one that committed (:meth:`run`)."""
        self._round_started = clock.now()
        self.first_answer_at: float | None = None
        """When the first answer of this round's fetch came (None: none, or not known)."""
        self.discovery = DiscoveryView(clock, self.tuning.heartbeat_seconds)
        self.on_committed: Callable[[float, int, int, int], None] | None = None
        """Told each commit's latency (seconds), bytes written, rows reduced and Arrow
        bytes fetched: the metrics hook."""
        self.queue_round = (
            QueueRound(processor.num_partitions) if isinstance(self.user, QueueReducer) else None
        )
        """A queue reducer's rounds and their state (None for a plain reducer)."""
        self.unsettled = UnsettledOutputs()
        """Staged files of commits whose outcome is unknown, published on the next rounds
        once the store tells that they landed."""

    def _note_error(self, what: str, exc: BaseException) -> None:
        """Count an error the loop goes on after, and log it."""
        self.errors += 1
        self.last_error = f"{what}: {type(exc).__name__}: {exc}"
        log.info("reducer %d: %s", self.index, self.last_error)
