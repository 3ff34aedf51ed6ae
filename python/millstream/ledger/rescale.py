"""The rescale plan: the record of an unfinished rescale (the new reducer count and how far
the old reducers drain), and the one transaction that hands the processor to the new
reducers.

A rescale changes ``num_reducers`` where no row has been committed by some reducers and
not by others. For each partition it takes the last shuffle index any old reducer
committed (or had spilled for it); the old reducers then commit every row up to it, in a
run whose mappers end their input at the first batch boundary past it (without the
reducers' ``drain`` and without sealing outputs). Then every row before each partition's
persisted state is committed by its owner and none after it by anyone, so
:func:`finish_rescale` gives every new reducer the same progress per partition (the
index before the persisted state) and drops the batch records after it: the rows after it
are cut, numbered and bucketed afresh by the new key-group ranges, and each is applied
once, by its new owner.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from millstream.exceptions import ConfigurationError
from millstream.ledger.mapper import (
    drained_key,
    plan_key,
    read_mapper_state,
    write_mapper_state,
)
from millstream.ledger.processor_record import (
    ProcessorInfo,
    read_processor_info,
    write_processor_info,
)
from millstream.ledger.reducer import (
    ReducerState,
    drained_marker_key,
    read_reducer_state,
    reduced_key,
    reducer_state_key,
    write_reducer_state,
)
from millstream.ledger.spill import spill_pending, spilled_through
from millstream.ledger.subspaces import SYSTEM, bad_record
from millstream.state.keys import decode_int64
from millstream.state.transaction import StoreTransaction

_TOTALS = ("rows", "bytes", "commits")

RESCALE_KEY = (*SYSTEM, "rescale")
"""Where an unfinished rescale is recorded (its :class:`RescalePlan`)."""


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


def committed_through(txn: StoreTransaction, info: ProcessorInfo, partition: int) -> int:
    """The last shuffle index of ``partition`` any reducer committed or had spilled for it
    (-1: none): the rows up to it must be committed by their old owners."""
    return max(
        max(
            read_reducer_state(txn, r, info.num_partitions).committed_row_indices[partition],
            spilled_through(txn, r, partition),
        )
        for r in range(info.num_reducers)
    )


def begin_rescale(txn: StoreTransaction, info: ProcessorInfo, num_reducers: int) -> RescalePlan:
    """Record a rescale of the processor ``info`` describes to ``num_reducers`` (or return
    the unfinished one to the same count).

    Raises:
        ConfigurationError: Another rescale is unfinished, or the processor cannot have
            ``num_reducers`` reducers.
    """
    if not 1 <= num_reducers <= info.key_groups:
        raise ConfigurationError(
            f"cannot rescale to {num_reducers} reducers: the processor has {info.key_groups} "
            "key groups, and every reducer owns at least one (the count is fixed when the "
            "processor is created: Processor(key_groups=...))"
        )
    if info.delivery != "exactly_once":
        raise ConfigurationError(
            "rescaling needs exactly-once delivery (the old reducers drain along the batches "
            "the mappers recorded, which at least once they do not record)"
        )
    plan = read_rescale(txn)
    if plan is not None:
        if plan.num_reducers != num_reducers:
            raise ConfigurationError(
                f"a rescale to {plan.num_reducers} reducers is unfinished: run it again to "
                "finish it before rescaling to another count"
            )
        return plan
    plan = RescalePlan(
        num_reducers,
        tuple(committed_through(txn, info, p) for p in range(info.num_partitions)),
    )
    txn.set(RESCALE_KEY, json.dumps(asdict(plan)).encode())
    return plan


def finish_rescale(txn: StoreTransaction, plan: RescalePlan) -> ProcessorInfo:
    """Hand the processor to ``plan.num_reducers`` reducers, in one transaction.

    Every new reducer's progress for a partition is the last shuffle index before the
    partition's persisted state, and the batch records after that state go (no row after
    it was committed: the new shape cuts and numbers them afresh). The old reducers'
    states and drained markers go, their totals are added to reducer 0's, and every
    mapper's state gets a new version (so that a mapper instance of the old shape that is
    still alive stops).

    Returns:
        The processor's record after the rescale.

    Raises:
        ConfigurationError: Some partition's persisted state is not past the rows the old
            reducers committed (they did not commit every row up to there).
    """
    info = read_processor_info(txn)
    if info is None:
        raise ConfigurationError("the store holds no processor to rescale")
    states = [read_mapper_state(txn, p) for p in range(info.num_partitions)]
    behind = [
        f"partition {p} persisted up to shuffle row {s.shuffle_unread_row_index}, not past {c}"
        for p, (s, c) in enumerate(zip(states, plan.committed, strict=True))
        if s.shuffle_unread_row_index <= c
    ]
    behind += [
        f"reducer {r} has spilled rows" for r in range(info.num_reducers) if spill_pending(txn, r)
    ]
    if behind:
        raise ConfigurationError(
            "the old reducers have not committed every row up to where any of them had: "
            + "; ".join(behind)
        )
    progress = ReducerState(tuple(s.shuffle_unread_row_index - 1 for s in states))
    for r in range(max(info.num_reducers, plan.num_reducers)):
        txn.clear(drained_marker_key(r))
        if r >= plan.num_reducers:
            txn.clear(reducer_state_key(r))
            for what in _TOTALS:
                raw = txn.get(reduced_key(r, what))
                if raw is not None:
                    txn.add(reduced_key(0, what), decode_int64(raw))
                    txn.clear(reduced_key(r, what))
        else:
            write_reducer_state(txn, r, progress)
    for p, state in enumerate(states):
        txn.clear(drained_key(p))
        txn.clear_range(plan_key(p, state.input_unread_row_index), plan_key(p, 2**62))
        # A new version: a mapper instance of the old shape still alive sees another
        # instance's write (split brain), restarts and finds the new count.
        write_mapper_state(txn, p, state)
    rescaled = replace(info, num_reducers=plan.num_reducers)
    write_processor_info(txn, rescaled)
    txn.clear(RESCALE_KEY)
    return rescaled
