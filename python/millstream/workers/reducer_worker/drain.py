"""A reducer's end of a run: its user's ``drain`` committed once, then its outputs closed.

Store failures here are the loop's to retry (:meth:`ReducerWorker.run` backs off as after
a failed round): the drain transaction checks its drained marker first, so running it
again after an unknown outcome commits it once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from millstream.api import Transaction
from millstream.exceptions import (
    CommitUnknownResultError,
    RetryableStoreError,
    StoreConflictError,
    StoreUnavailableError,
    TransactionTooLargeError,
    UserCodeError,
)
from millstream.ledger import drained_marker_key
from millstream.outputs import finish_publishing, seal_queues
from millstream.state.replay import ReplayingTransaction
from millstream.workers.reducer_worker.settling import DRAIN

if TYPE_CHECKING:
    from millstream.workers.reducer_worker import ReducerWorker


def finish(worker: ReducerWorker) -> bool:
    """Once the processor drained: the user's ``drain`` transaction (once), then the
    outputs. Returns False when the drain transaction lost a conflict (call again).

    Every row is committed by every reducer; once every reducer's ``drain`` committed
    too, nothing appends to the output queues again, and the last reducer to get there
    seals them, so that a processor reading them drains too.

    Raises:
        UserCodeError: ``drain`` raised; nothing of it was committed.
        RetryableStoreError, StoreUnavailableError: The store failed; call again later.
    """
    if not commit_drain(worker):
        return False
    worker.settle_unknown_commits()
    reducers = range(worker.processor.num_reducers)
    with worker.store.read() as txn:
        everyone = all(txn.get(drained_marker_key(r)) is not None for r in reducers)
    if everyone:
        seal_queues(worker.processor.outputs)
    finish_publishing(worker.processor.outputs)
    return True


def commit_drain(worker: ReducerWorker) -> bool:
    """Run ``Reducer.drain`` in a transaction with the reducer's drained marker; True once
    the marker is committed (by this call or an earlier one), False after a conflict."""
    txn = ReplayingTransaction(worker.store)
    outputs = worker._staged_outputs()
    try:
        with outputs.settled_with(txn):
            if txn.get(drained_marker_key(worker.index)) is not None:
                txn.reset()
                worker.unsettled.committed(DRAIN, wrote=True)
                return True
            try:
                worker.user.drain(Transaction(txn, outputs))
            except (RetryableStoreError, StoreUnavailableError, TransactionTooLargeError):
                raise
            except Exception as exc:
                raise UserCodeError(
                    f"drain of reducer {worker.index} raised: {exc!r}. Nothing of it was "
                    "committed; fix the reducer and restart the processor"
                ) from exc
            txn.set(drained_marker_key(worker.index), b"")
            outputs.apply(txn)
            txn.commit()
    except StoreConflictError:
        return False
    except CommitUnknownResultError:
        worker.unsettled.hold(outputs, DRAIN, read=False)
        raise
    worker.unsettled.committed(DRAIN, wrote=True)
    worker._published(outputs)
    worker._notify_commit()
    return True
