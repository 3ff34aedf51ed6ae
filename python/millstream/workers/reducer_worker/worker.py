"""The reducer worker (thesis 4.4.2): the view a round starts from, the round, and the
loop (the instance's state: :mod:`.instance`).

:meth:`ReducerWorker.run_once` is one iteration of the main procedure, a plain method a
simulation can drive; :meth:`~ReducerWorker.run` is the thin loop around it. The steps live
in the package's other modules: :mod:`.fetch`, :mod:`.plain_round`, :mod:`.queue_round`,
:mod:`.spill_reads`, :mod:`.commit`, :mod:`.reduce_dead_letters`, :mod:`.drain` and
:mod:`.figures`.
"""

from __future__ import annotations

import logging
import threading

from millstream.backoff import Backoff
from millstream.exceptions import RetryableStoreError, StoreUnavailableError, UserCodeError
from millstream.ledger import (
    ReducerState,
    WorkerInfo,
    drained_key,
    drained_mappers,
    list_workers,
    read_reducer_state,
    read_rescale,
    remove_stale_workers,
)
from millstream.ledger.spill import spill_pending
from millstream.outputs import finish_publishing
from millstream.rpc.calls import AnswerWaiter
from millstream.workers.reducer_worker import drain
from millstream.workers.reducer_worker.figures import ReducerFigures
from millstream.workers.reducer_worker.plain_round import PlainRound

log = logging.getLogger("millstream.reducer")


class ReducerWorker(PlainRound, ReducerFigures):
    """One reducer instance (:class:`~.instance.ReducerInstance` says what it is given),
    a thin loop over the steps of its rounds.
    """

    def _read_view(self) -> tuple[ReducerState, dict[int, WorkerInfo], set[int]]:
        """Steps 2-3: the persisted state, live mappers, and mappers already drained.

        Mapper entries that stopped beating (on this reducer's clock) are skipped and
        removed from discovery.
        """
        m = self.processor.num_partitions
        with self.time_spent.spent_on("store"), self.store.read() as txn:
            state = read_reducer_state(txn, self.index, m)
            mappers, dead = self.discovery.observe(list_workers(txn, "mapper"))
            drained = drained_mappers(txn, m)
            self._spill_pending = spill_pending(txn, self.index)
        if dead:
            self._forget_mappers(dead)
        return state, mappers, drained

    def _forget_mappers(self, dead: list[WorkerInfo]) -> None:
        """Remove dead mapper entries from discovery; failing is harmless (retried later)."""
        txn = self.store.create_transaction()
        try:
            removed = remove_stale_workers(txn, dead)
            txn.commit()
        except (RetryableStoreError, StoreUnavailableError) as exc:
            self._note_error("removing dead mappers from discovery", exc)
            return
        finally:
            txn.reset()
        if removed:
            log.info(
                "reducer %d: removed %d mapper(s) that stopped beating from discovery: %s",
                self.index,
                removed,
                ", ".join(f"{w.index}@{w.guid}" for w in dead),
            )

    def drained_now(self) -> bool:
        """Whether every mapper has drained (a cheap check between commits)."""
        try:
            with self.store.read() as txn:
                return all(
                    txn.get(drained_key(i), snapshot=True) is not None
                    for i in range(self.processor.num_partitions)
                )
        except (RetryableStoreError, StoreUnavailableError):
            return False

    def run_once(self) -> bool:
        """One iteration of thesis 4.4.2 (steps 2-8). Returns whether a batch was committed.

        Mappers that fail to answer are skipped this round (their committed index stays).

        Raises:
            UserCodeError: ``reduce`` raised; nothing of the batch was committed.
            TransactionTooLargeError: Even a single row's writes exceed the store's limit.
            RetryableStoreError, StoreUnavailableError: The store failed; retry later.
        """
        self._round_started = self.clock.now()
        self.first_answer_at = None
        state, mappers, drained = self._read_view()
        self.settle_unknown_commits()
        self.last_state = state
        self.user.drained_partitions = frozenset() if self.rescaling else frozenset(drained)
        self.all_drained = len(drained) == self.processor.num_partitions and not self._spill_pending
        live = {
            m: info
            for m, info in mappers.items()
            if m not in drained and 0 <= m < self.processor.num_partitions
        }
        if self._await_missing_mappers(len(live) + len(drained)):
            return False
        if self.queue_round is not None:
            return self.queue_round.run(self, state, live, drained)
        return self._run_plain_round(state, live)

    def finish(self) -> bool:
        """Once the processor drained: the user's ``drain`` committed once, then the outputs
        (:func:`.drain.finish`). Returns False after a conflict (call again).

        Raises:
            UserCodeError: ``drain`` raised; nothing of it was committed.
            RetryableStoreError, StoreUnavailableError: The store failed; call again later.
        """
        return drain.finish(self)

    def start_up(self) -> None:
        """What an instance reads before its first round: it publishes the files its
        predecessors' commits recorded, and learns whether this run is a rescale's (which
        ends at its cut, not at the processor's end: no drain).

        Raises:
            RetryableStoreError, StoreUnavailableError: The store failed; call again later.
        """
        finish_publishing(self.processor.outputs)
        with self.store.read() as txn:
            self.rescaling = read_rescale(txn) is not None

    def run(self, stop: threading.Event) -> None:
        """Reduce until every mapper is drained or ``stop`` is set: the thin loop.

        Starts a round about one interval after the start of the last round that committed
        (rows accumulate meanwhile and go into one transaction), the interval and where it
        counts from as :class:`~millstream.workers.reducer_worker.cadence.CommitCadence`
        says, unless the last fetch hit its row or byte cap, the mappers are behind (then
        they hold the next fetch until a full commit's worth of rows gathers, see
        :attr:`gathering`), or every mapper has drained; polls an idle processor less and
        less often, down to ten times a second, woken in between by the answer of a call
        its mappers hold (:meth:`_wait_idle`); and backs off after errors (thesis 4.4.2
        step 1).
        """
        t = self.tuning
        backoff = Backoff(t.backoff_seconds, t.backoff_max_seconds)
        idle = Backoff(t.idle_seconds, max(t.idle_seconds, min(0.1, t.commit_interval_seconds)))
        cadence = self.cadence
        last_start = self.clock.now() - cadence.interval  # of the last round that committed
        while not stop.is_set():
            try:
                self.start_up()
                break
            except (RetryableStoreError, StoreUnavailableError) as exc:
                self._note_error("store, starting", exc)
                self.clock.sleep(backoff.next(), stop)
        while not stop.is_set():
            wait = cadence.interval - (self.clock.now() - last_start)
            while wait > 0 and not self.capped and not self.gathering and not stop.is_set():
                self.clock.sleep(min(wait, 0.1), stop)
                wait = cadence.interval - (self.clock.now() - last_start)
                if wait > 0 and self.drained_now():
                    break
            started = self.clock.now()
            try:
                committed = self.run_once()
            except UserCodeError as exc:
                if t.on_user_error != "retry":
                    raise
                self._note_error("reduce", exc)
                self.clock.sleep(backoff.next(), stop)
                continue
            except (RetryableStoreError, StoreUnavailableError) as exc:
                self._note_error("store", exc)
                self.clock.sleep(backoff.next(), stop)
                continue
            try:
                if self.all_drained and (self.rescaling or self.finish()):
                    return
            except (RetryableStoreError, StoreUnavailableError) as exc:
                self._note_error("store, draining", exc)
                self.clock.sleep(backoff.next(), stop)
                continue
            if committed:
                backoff.reset()
                idle.reset()
                last_start = cadence.counted_from(started, self.first_answer_at)
            else:
                self._wait_idle(idle.next(), stop)

    def _wait_idle(self, seconds: float, stop: threading.Event) -> None:
        """After a round that committed nothing: wait ``seconds`` at most, woken by the
        answer of a call still under way (a mapper answers a held call as soon as rows
        reach its window), so that rows arriving meanwhile do not wait for the rest of the
        pause; a client that keeps no call under way sleeps."""
        client = self.rows_client
        if isinstance(client, AnswerWaiter):
            self.clock.wait(client.wait_for_answer, seconds, stop)
        else:
            self.clock.sleep(seconds, stop)
