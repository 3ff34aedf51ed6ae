"""A processor's records: its counts and fingerprint, the checks a runner makes before
starting workers, and the totals of its runs (what the local and Spark runners report)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from millstream.exceptions import ConfigurationError
from millstream.ledger.mapper import drained_key, mapped_key, read_mapper_state
from millstream.ledger.reducer import reduced_key
from millstream.ledger.subspaces import SYSTEM, bad_record
from millstream.state.keys import decode_int64
from millstream.state.store import Store
from millstream.state.transaction import StoreTransaction

DEFAULT_KEY_GROUPS = 128
"""Key groups of a processor that does not choose its own: the most reducers it can be
rescaled to."""


@dataclass(frozen=True)
class ProcessorInfo:
    """What a processor's state was created with.

    Attributes:
        num_partitions: Number of input partitions (fixed for ever: the mappers' records
            and the reducers' progress are kept per partition; the number of mapper workers
            reading them may change between runs).
        num_reducers: Number of reducers.
        fingerprint: Anything else that must not change between runs (e.g. a hash of the
            mapper and reducer class names); free-form.
        delivery: ``"exactly_once"`` or ``"at_least_once"`` (the mappers of the two modes
            keep different records, so a processor keeps its mode).
        key_groups: Key groups, fixed for ever; ``num_reducers`` changes only through a
            rescale, to at most this many.
    """

    num_partitions: int
    num_reducers: int
    fingerprint: str = ""
    delivery: str = "exactly_once"
    key_groups: int = DEFAULT_KEY_GROUPS


_PROCESSOR_KEY = (*SYSTEM, "processor")
RESCALE_KEY = (*SYSTEM, "rescale")
"""Where an unfinished rescale is recorded (:mod:`millstream.ledger.rescale`)."""


def write_processor_info(txn: StoreTransaction, info: ProcessorInfo) -> None:
    """Store the processor's metadata (overwrites)."""
    txn.set(_PROCESSOR_KEY, json.dumps(asdict(info), sort_keys=True).encode())


def read_processor_info(txn: StoreTransaction) -> ProcessorInfo | None:
    """The stored processor metadata, ``None`` for a new processor."""
    raw = txn.get(_PROCESSOR_KEY)
    if raw is None:
        return None
    try:
        fields = json.loads(raw)
        if "num_mappers" in fields:  # written when every mapper read one partition
            fields["num_partitions"] = fields.pop("num_mappers")
        return ProcessorInfo(**fields)
    except Exception as exc:
        raise bad_record("processor metadata", raw, exc) from exc


@dataclass(frozen=True)
class RescalePlan:
    """An unfinished rescale.

    Attributes:
        num_reducers: The reducer count after the rescale.
        committed: Per partition, the last shuffle index any old reducer committed (or
            had spilled for it): the old reducers commit every row up to it first.
    """

    num_reducers: int
    committed: tuple[int, ...]


def read_rescale(txn: StoreTransaction) -> RescalePlan | None:
    """The unfinished rescale, if any."""
    raw = txn.get(RESCALE_KEY)
    if raw is None:
        return None
    try:
        fields = json.loads(raw)
        return RescalePlan(int(fields["num_reducers"]), tuple(int(c) for c in fields["committed"]))
    except Exception as exc:
        raise bad_record("rescale plan", raw, exc) from exc


def _same_classes(stored: ProcessorInfo, info: ProcessorInfo) -> bool:
    """Whether a fingerprint of earlier releases (classes with their module, such as
    ``jobs.Sum->jobs.Store``) names the classes of ``info`` (``Sum->Store``)."""
    if stored == info:
        return True
    if (stored.num_partitions, stored.num_reducers, stored.delivery, stored.key_groups) != (
        info.num_partitions,
        info.num_reducers,
        info.delivery,
        info.key_groups,
    ):
        return False
    old, new = stored.fingerprint.split("->"), info.fingerprint.split("->")
    return len(old) == len(new) == 2 and all(
        o == n or o.endswith(f".{n}") for o, n in zip(old, new, strict=True)
    )


def check_processor_info(txn: StoreTransaction, info: ProcessorInfo) -> None:
    """Record ``info`` for a new processor, or refuse a restart that does not match it.

    Raises:
        ConfigurationError: The stored counts or fingerprint differ from ``info``.
    """
    stored = read_processor_info(txn)
    if stored is None:
        write_processor_info(txn, info)
        return
    if _same_classes(stored, info):
        return
    if _same_classes(replace(stored, num_reducers=info.num_reducers), info):
        raise ConfigurationError(
            f"this processor has {stored.num_reducers} reducers but was started with "
            f"{info.num_reducers}. Change its number of reducers with a rescale, which "
            "commits the rows in flight and hands the key groups to the new reducers: "
            f"`millstream rescale <job>:processor --reducers {info.num_reducers}` (or "
            "millstream.rescale(processor)), then start it again."
        )
    raise ConfigurationError(
        f"this store prefix holds a processor with {stored.num_partitions} partitions, "
        f"{stored.num_reducers} reducers, {stored.key_groups} key groups, fingerprint "
        f"{stored.fingerprint!r} and delivery {stored.delivery!r}, but it was started with "
        f"{info.num_partitions} partitions, {info.num_reducers} reducers, {info.key_groups} "
        f"key groups, fingerprint {info.fingerprint!r} and delivery {info.delivery!r}. "
        "Restart it with the original configuration, or use a new store prefix (or file) "
        "for the new one."
    )


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
