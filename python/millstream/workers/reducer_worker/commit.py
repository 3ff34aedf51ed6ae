"""The reducer's commit (thesis 4.4.2 steps 5-8): the user's code inside one transaction
with the re-read of the reducer's state (split brain), the new committed indices, cleared
spilled rows, the outputs it staged, and the counters; and what follows a commit (the
user's ``on_commit``, the staged files published, commits of unknown outcome settled)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from millstream.exceptions import (
    CommitUnknownResultError,
    RetryableStoreError,
    StoreConflictError,
    StoreUnavailableError,
    TransactionTooLargeError,
    UserCodeError,
)
from millstream.ledger import ReducerState, reduced_key, write_reducer_state
from millstream.outputs import StagedOutputs
from millstream.state import StoreTransaction
from millstream.state.replay import ReplayingTransaction
from millstream.workers.fencing import read_commit_fences
from millstream.workers.reducer_worker.instance import ReducerInstance
from millstream.workers.reducer_worker.round_record import Round
from millstream.workers.reducer_worker.settling import ROUND
from millstream.workers.reducer_worker.spill_reads import clear_committed_spill

log = logging.getLogger("millstream.reducer")


class ReducerCommit(ReducerInstance):
    """The reducer's commit (a part of :class:`ReducerWorker`)."""

    def _user_code(self, call: Callable[[], object], what: str) -> None:
        """Run the user's ``reduce`` or ``process``; its errors (not the store's) become a
        :class:`UserCodeError` that says ``what`` and that nothing was committed."""
        try:
            with self.time_spent.spent_on("reduce"):
                call()
        except (RetryableStoreError, StoreUnavailableError, TransactionTooLargeError):
            raise
        except Exception as exc:
            raise UserCodeError(
                f"{what}: {exc!r}. Nothing of this batch was committed; fix the reducer and "
                "restart the processor"
            ) from exc

    def _reduce_and_commit(
        self,
        state: ReducerState,
        reduce: Callable[[StoreTransaction, StagedOutputs], Round | None],
        fetched: int,
        served_by: dict[int, str],
        *,
        splittable: bool = False,
    ) -> bool:
        """Steps 5-8: reduce inside a transaction, re-check the state, write it, commit.

        ``reduce`` runs the user's code through the transaction and says what to commit
        with it (a :class:`Round`), or None to commit nothing (a queue reducer's round that
        finished and wrote nothing); ``fetched`` is the Arrow bytes the rows took.

        At least once, the transaction also checks that every mapper instance in
        ``served_by`` (mapper index: GUID of the instance that served its rows) still owns
        its mapper's numbering: rows of an instance a newer one took over from may be
        numbered differently from the newer one's, so they are not committed.
        ``consumed`` (mapper index: shuffle index) names spilled rows the batch holds:
        their chunks are cleared in the same transaction.

        The transaction replays itself into a new one when ``reduce`` runs longer than
        half the store's time limit (:class:`ReplayingTransaction`), so a slow ``reduce``
        commits instead of failing as too old for ever; its reads stay conflict-checked, and
        the re-read of the reducer's state below is one of them. A ``splittable`` commit
        (of several rows, which the reducer splits when too large) is held to the backend's
        own size limit (:attr:`StoreTransaction.commit_size`).
        """
        begun = self.clock.now()
        txn = ReplayingTransaction(self.store, splittable=splittable)
        outputs = self._staged_outputs()
        try:
            with self.time_spent.spent_on("store"), outputs.settled_with(txn):
                done = reduce(txn, outputs)
                if done is None:
                    txn.reset()
                    return False
                new, rows, consumed = done.state, done.rows, done.consumed
                stored, superseded = read_commit_fences(
                    txn,
                    self.index,
                    self.processor.num_partitions,
                    served_by if self.processor.at_least_once else {},
                )
                if stored != state:
                    self.split_brains += 1
                    txn.reset()
                    return False
                if superseded:
                    self.superseded_fetches += 1
                    log.info(
                        "reducer %d: rows of superseded mapper instances %s are not "
                        "committed; the instances that took over serve them again",
                        self.index,
                        superseded,
                    )
                    txn.reset()
                    return False
                write_reducer_state(txn, self.index, new)
                clear_committed_spill(txn, self.index, consumed)
                txn.add(reduced_key(self.index, "rows"), rows)
                txn.add(reduced_key(self.index, "bytes"), fetched)
                txn.add(reduced_key(self.index, "commits"), 1)
                outputs.apply(txn)
                size, commit_size = txn.write_size, txn.commit_size
                started = time.perf_counter()
                txn.commit()
                latency = time.perf_counter() - started
        except StoreConflictError:
            self.split_brains += 1
            return False
        except CommitUnknownResultError:
            self.unsettled.hold(outputs, ROUND, read=state)
            raise
        finally:
            self.renewals += txn.renewals
        self.unsettled.committed(ROUND, wrote=new)
        self._published(outputs)
        self.last_state = new
        self.last_commit_size = commit_size
        self.last_transaction_seconds = self.clock.now() - begun
        # Before the next round's calls say when it starts (:meth:`_send_next_round`): the
        # mappers answer at the moment the reducer's loop starts that round.
        self.cadence.observe(self.last_transaction_seconds)
        self.commits += 1
        if self.on_committed is not None:
            self.on_committed(latency, size, rows, fetched)
        self.rows_reduced += rows
        self.bytes_fetched += fetched
        return True

    def _notify_commit(self) -> None:
        """Run the user's :meth:`~millstream.Reducer.on_commit`; its errors are only logged."""
        try:
            self.user.on_commit()
        except Exception as exc:
            self._note_error("on_commit", exc)

    def settle_unknown_commits(self) -> None:
        """Publish the files of earlier commits reported unknown that landed after all
        (:class:`~millstream.workers.reducer_worker.settling.UnsettledOutputs`), and count them."""
        for outputs in self.unsettled.settle(self.store):
            self.rows_emitted += outputs.rows_appended
            self.files_published += outputs.files_staged

    def _staged_outputs(self) -> StagedOutputs:
        """What one transaction's user code sends to the processor's outputs."""
        return StagedOutputs(self.processor.outputs, f"reducer-{self.index}", self.index)

    def _published(self, outputs: StagedOutputs) -> None:
        """After a commit: publish its staged files and count what it sent."""
        outputs.publish()
        self.rows_emitted += outputs.rows_appended
        self.files_published += outputs.files_staged
