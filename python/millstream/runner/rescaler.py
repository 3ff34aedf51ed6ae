"""Rescaling reducers: change a processor's ``num_reducers`` without losing or repeating a
row (:func:`rescale`, ``millstream rescale``).

The old reducers first commit every row up to the last one any of them committed (so that
no row is committed by some reducers and not by others), in a run of the old shape whose
inputs end there; one transaction then hands the key groups to the new reducers
(:mod:`millstream.ledger.rescale`). The rows after it go to their new owners when the
processor starts again. A rescale that is stopped (or killed) resumes where it was when
run again.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from millstream.api import Transaction
from millstream.exceptions import ConfigurationError
from millstream.ledger import (
    ProcessorInfo,
    WorkerInfo,
    check_processor_info,
    list_workers,
    read_processor_info,
    read_rescale,
    summarize,
)
from millstream.ledger.rescale import begin_rescale, finish_rescale
from millstream.processor import Processor
from millstream.queue_reducer import QueueReducer
from millstream.runner.local import LocalRunner
from millstream.state import Store, StoreTransaction


@dataclass(frozen=True)
class RescaleSummary:
    """What a rescale did.

    Attributes:
        old_reducers: Reducers before.
        new_reducers: Reducers after.
        rows_drained: Input rows the old reducers' run committed (and persisted) to get
            past every row any of them had committed.
        seconds: Wall time, from the start to the transaction that handed over.
        drain_seconds: Of which the old shape's run.
        handover_bytes: Keys and values the handing-over transaction wrote.
    """

    old_reducers: int
    new_reducers: int
    rows_drained: int
    seconds: float
    drain_seconds: float
    handover_bytes: int = 0

    def __str__(self) -> str:
        if self.old_reducers == self.new_reducers:
            return f"already {self.new_reducers} reducers: nothing to rescale"
        return (
            f"rescaled from {self.old_reducers} to {self.new_reducers} reducers in "
            f"{self.seconds:.2f} s ({self.rows_drained:,} input rows committed by the old "
            f"reducers first, in {self.drain_seconds:.2f} s; the handover wrote "
            f"{self.handover_bytes:,} bytes)"
        )


def rescale(
    processor: Processor,
    *,
    progress: bool = False,
    timeout: float | None = None,
    out: TextIO = sys.stderr,
) -> RescaleSummary:
    """Give a stopped processor ``processor.num_reducers`` reducers.

    ``processor`` is the job as it will run after the rescale (its ``num_reducers`` the
    new count); its store holds the state of the old count. No worker of the processor may
    be running. Start the processor again afterwards, as usual.

    Args:
        processor: The processor with its new ``num_reducers``.
        progress: Print progress lines to ``out`` while the old reducers drain.
        timeout: Give up on the drain after this many seconds (a rerun resumes).
        out: Where progress goes.

    Raises:
        ConfigurationError: Workers of the processor are alive, the store holds no or
            another processor, the new count exceeds its key groups, or its reducer keeps
            rows pending without storing them for a rescale (a
            :class:`~millstream.QueueReducer` without ``hand_over``).
        TimeoutError: The drain did not finish within ``timeout``.
    """
    started = time.monotonic()
    _check_movable(processor)
    store = processor.open_store()
    try:
        _check_stopped(store, processor)
        info = store.transact(lambda txn: _begin(txn, processor), idempotent=True)
        before = summarize(store, info, 0, 0.0).rows_read
    finally:
        store.close()
    if info.num_reducers == processor.num_reducers:
        return RescaleSummary(info.num_reducers, info.num_reducers, 0, 0.0, 0.0)
    if progress:
        print(
            f"millstream: rescaling {processor.name} from {info.num_reducers} to "
            f"{processor.num_reducers} reducers: the old reducers first commit the rows "
            "some of them had committed",
            file=out,
        )
    old = dataclasses.replace(processor, num_reducers=info.num_reducers)
    drain_started = time.monotonic()
    LocalRunner(old, progress=progress, out=out, rescaling=True).run(timeout)
    drain_seconds = time.monotonic() - drain_started
    store = processor.open_store()
    try:
        drained = summarize(store, info, 0, 0.0).rows_read - before

        def hand_over(txn: StoreTransaction) -> int:
            plan = read_rescale(txn)
            if plan is None:
                return 0  # handed over already (by a commit whose outcome was unknown)
            finish_rescale(txn, plan)
            processor.reducer.on_rescale(Transaction(txn), info.num_reducers, plan.num_reducers)
            return txn.write_size

        handover = store.transact(hand_over, idempotent=True)
    finally:
        store.close()
    summary = RescaleSummary(
        info.num_reducers,
        processor.num_reducers,
        drained,
        time.monotonic() - started,
        drain_seconds,
        handover,
    )
    if progress:
        print(f"millstream: {summary}", file=out)
    return summary


def _check_movable(processor: Processor) -> None:
    """Refuse queue reducers that cannot store their pending rows for the new owners: a
    rescale needs a point up to which every old reducer finished every row."""
    reducer = processor.reducer
    if issubclass(reducer, QueueReducer) and not reducer.can_hand_over():
        raise ConfigurationError(
            f"{reducer.__name__} cannot be rescaled: it is a QueueReducer, whose pending "
            "rows stay unfinished until later rows arrive, and it does not override "
            "QueueReducer.hand_over, which a rescale calls to store them, by key group, "
            "for their new owners (PendingPaneReducer does). Override it, or start the "
            "processor with the new count under a new name"
        )


def _check_stopped(store: Store, processor: Processor) -> None:
    """Refuse while any worker of the processor beats (its entry's beat counter moves
    within two heartbeat periods; clocks are never compared)."""

    def entries() -> dict[tuple[str, str], WorkerInfo]:
        with store.read() as txn:
            return {
                (w.role, w.guid): w
                for role in ("mapper", "reducer")
                for w in list_workers(txn, role)
            }

    first = entries()
    if not first:
        return
    time.sleep(2.5 * processor.tuning.heartbeat_seconds)
    alive = sorted(
        f"{w.role} {w.index} (pid {w.pid} on {w.host})"
        for key, w in entries().items()
        if key not in first or w.beats != first[key].beats
    )
    if alive:
        raise ConfigurationError(
            "workers of this processor are running: "
            + ", ".join(alive)
            + ". Stop the processor (Ctrl-C, or cancel its Spark job) before rescaling it"
        )


def _begin(txn: StoreTransaction, processor: Processor) -> ProcessorInfo:
    """Record the rescale (or find it recorded); the stored processor."""
    info = read_processor_info(txn)
    if info is None:
        raise ConfigurationError(
            f"the store holds no state of processor {processor.name!r} to rescale: start it "
            f"with num_reducers={processor.num_reducers} instead"
        )
    check_processor_info(txn, dataclasses.replace(processor.info, num_reducers=info.num_reducers))
    if info.num_reducers != processor.num_reducers or read_rescale(txn) is not None:
        begin_rescale(txn, info, processor.num_reducers)
    return info
