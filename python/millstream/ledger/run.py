"""A run of a processor as its records see it: the store prepared before the workers
start (:func:`prepare_store`) and the run's totals (:class:`RunSummary`, what the local and
Spark runners report)."""

from __future__ import annotations

from dataclasses import dataclass

from millstream.exceptions import ConfigurationError
from millstream.ledger.mapper import drained_key, mapped_key, read_mapper_state
from millstream.ledger.processor_record import ProcessorInfo, check_processor_info
from millstream.ledger.reducer import reduced_key
from millstream.ledger.rescale import read_rescale
from millstream.state.keys import decode_int64
from millstream.state.store import Store
from millstream.state.transaction import StoreTransaction


@dataclass(frozen=True)
class RunSummary:
    """What a drained run did.

    The counts are the processor's totals over all its runs (its store keeps them); the
    rates in ``str()`` are this run's: rows and bytes since it started over its wall time.

    Attributes:
        rows_read: Input rows whose effects are committed (sum over mappers).
        rows_shuffled: Mapped rows (shuffle numbering, sum over mappers).
        rows_reduced: Rows committed by reducers in total (all runs of this processor).
        commits: Reducer transactions committed in total.
        restarts: Worker processes restarted after dying, in this run.
        seconds: Wall time of this run.
        batches: Mapped batches whose effects were persisted (all runs; replays after a
            restart count again).
        bytes_shuffled: Arrow IPC bytes reducers fetched and committed (all runs).
        rows_read_before: ``rows_read`` when this run started (earlier runs' rows).
        bytes_shuffled_before: ``bytes_shuffled`` when this run started.
        drained: False for a run that was stopped (Ctrl-C, SIGTERM) before its input
            drained; a rerun resumes from its last commits.
    """

    rows_read: int
    rows_shuffled: int
    rows_reduced: int
    commits: int
    restarts: int
    seconds: float
    batches: int = 0
    bytes_shuffled: int = 0
    rows_read_before: int = 0
    bytes_shuffled_before: int = 0
    drained: bool = True

    def __str__(self) -> str:
        seconds = max(self.seconds, 1e-9)
        rows = self.rows_read - self.rows_read_before
        shuffled = self.bytes_shuffled - self.bytes_shuffled_before
        this_run = f" ({rows:,} in this run)" if self.rows_read_before else ""
        return (
            f"{'drained' if self.drained else 'stopped'}: "
            f"{self.rows_read:,} rows read{this_run} in {self.batches:,} batches, "
            f"{self.rows_shuffled:,} shuffled ({self.bytes_shuffled / 1e6:,.1f} MB), "
            f"{self.rows_reduced:,} reduced in {self.commits:,} commits, "
            f"{self.restarts} restarts, {self.seconds:.2f} s "
            f"({rows / seconds:,.0f} rows/s, {shuffled / seconds / 1e6:,.1f} MB/s shuffled)"
        )


def prepare_store(store: Store, info: ProcessorInfo, *, rescaling: bool = False) -> None:
    """Checks and resets a runner does before starting workers.

    Refuses a store holding another processor's state, or an unfinished rescale (unless
    ``rescaling``: the rescale's own run), and clears the drained markers of an earlier
    run so that no reducer stops before this run's mappers have drained.
    """

    def prepare(txn: StoreTransaction) -> None:
        check_processor_info(txn, info)
        plan = read_rescale(txn)
        if plan is not None and not rescaling:
            raise ConfigurationError(
                f"a rescale of this processor to {plan.num_reducers} reducers is unfinished "
                f"(it was stopped): finish it with `millstream rescale <job>:processor "
                f"--reducers {plan.num_reducers}` (or millstream.rescale), then start the "
                "processor with that many reducers"
            )
        for m in range(info.num_partitions):
            txn.clear(drained_key(m))

    # Idempotent: it checks the processor's record and clears markers.
    store.transact(prepare, idempotent=True)


def summarize(
    store: Store,
    info: ProcessorInfo,
    restarts: int,
    seconds: float,
    before: RunSummary | None = None,
    *,
    drained: bool = True,
) -> RunSummary:
    """Totals of a processor from its store; ``before``: the totals when the run started."""
    with store.read() as txn:
        mappers = range(info.num_partitions)
        reducers = range(info.num_reducers)
        states = [read_mapper_state(txn, m) for m in mappers]

        def counter(key: tuple[str, str, int, str]) -> int:
            raw = txn.get(key)
            return 0 if raw is None else decode_int64(raw)

        rows = sum(counter(reduced_key(r, "rows")) for r in reducers)
        commits = sum(counter(reduced_key(r, "commits")) for r in reducers)
        shuffled = sum(counter(reduced_key(r, "bytes")) for r in reducers)
        batches = sum(counter(mapped_key(m, "batches")) for m in mappers)
    return RunSummary(
        sum(s.input_unread_row_index for s in states),
        sum(s.shuffle_unread_row_index for s in states),
        rows,
        commits,
        restarts,
        seconds,
        batches,
        shuffled,
        before.rows_read if before is not None else 0,
        before.bytes_shuffled if before is not None else 0,
        drained,
    )


__all__ = ["RunSummary", "prepare_store", "summarize"]
