"""A rescale's records: the new reducer count and the cut the old reducers drain to, and
the one transaction that hands the processor to the new reducers.

A rescale changes ``num_reducers`` at a cut. The cut of a partition is the furthest input
row any mapper instance recorded a batch up to (exactly once, no row after it was ever
served to a reducer). The old reducers commit every row before the cut, as if the input
ended there (without their ``drain`` and without sealing outputs); then every partition's
persisted state is at its cut, every row before it committed by its owner, none after it
by anyone. :func:`finish_rescale` then gives every new reducer the same progress per
partition (everything numbered before the persisted state), so the rows after the cut are
bucketed by the new key-group ranges when the mappers read them, and each is applied once,
by its new owner.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

from millstream.exceptions import ConfigurationError
from millstream.ledger.mapper import (
    drained_key,
    plan_key,
    read_mapper_state,
    write_mapper_state,
)
from millstream.ledger.processor import (
    RESCALE_KEY,
    ProcessorInfo,
    RescalePlan,
    read_processor_info,
    read_rescale,
    write_processor_info,
)
from millstream.ledger.reducer import (
    ReducerState,
    drained_marker_key,
    reduced_key,
    reducer_state_key,
    write_reducer_state,
)
from millstream.ledger.spill import spill_pending
from millstream.state.base import StoreTransaction
from millstream.state.keys import decode_int64, unpack

_TOTALS = ("rows", "bytes", "commits")


def recorded_end(txn: StoreTransaction, partition: int) -> int:
    """The furthest input row of ``partition`` that any mapper instance recorded a batch
    up to (its persisted state when none is recorded): no row after it was ever served."""
    persisted = read_mapper_state(txn, partition).input_unread_row_index
    last = txn.get_range(plan_key(partition, 0), plan_key(partition, 2**62), limit=1, reverse=True)
    if not last:
        return persisted
    return max(persisted, int(unpack(last[0][1])[0]))


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
            "rescaling needs exactly-once delivery (its cut is where the mappers recorded "
            "their batches, which at least once they do not record)"
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
        num_reducers, tuple(recorded_end(txn, p) for p in range(info.num_partitions))
    )
    txn.set(RESCALE_KEY, json.dumps(asdict(plan)).encode())
    return plan


def finish_rescale(txn: StoreTransaction, plan: RescalePlan) -> ProcessorInfo:
    """Hand the processor to ``plan.num_reducers`` reducers, in one transaction.

    Every new reducer's progress for a partition is the last shuffle index before the
    partition's persisted state; the old reducers' states and drained markers go, their
    totals are added to reducer 0's, and every mapper's state gets a new version (so that
    a mapper instance of the old shape that is still alive stops).

    Returns:
        The processor's record after the rescale.

    Raises:
        ConfigurationError: Some partition's persisted state is not at its cut (the old
            reducers did not commit every row before it).
    """
    info = read_processor_info(txn)
    if info is None:
        raise ConfigurationError("the store holds no processor to rescale")
    states = [read_mapper_state(txn, p) for p in range(info.num_partitions)]
    behind = [
        f"partition {p} at input row {s.input_unread_row_index} (cut {c})"
        for p, (s, c) in enumerate(zip(states, plan.cut, strict=True))
        if s.input_unread_row_index != c
    ]
    behind += [
        f"reducer {r} has spilled rows" for r in range(info.num_reducers) if spill_pending(txn, r)
    ]
    if behind:
        raise ConfigurationError(
            "the old reducers have not committed every row before the rescale's cut: "
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
        # A new version: a mapper instance of the old shape still alive sees another
        # instance's write (split brain), restarts and finds the new count.
        write_mapper_state(txn, p, state)
    rescaled = replace(info, num_reducers=plan.num_reducers)
    write_processor_info(txn, rescaled)
    txn.clear(RESCALE_KEY)
    return rescaled
