"""The processor's record: what its state was created with (counts, delivery, key groups,
fingerprint), and the check that a store holds this processor's state and no other's."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from millstream.exceptions import ConfigurationError
from millstream.key_groups import DEFAULT_KEY_GROUPS
from millstream.ledger.subspaces import SYSTEM, bad_record
from millstream.state.transaction import StoreTransaction


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


__all__ = ["ProcessorInfo", "check_processor_info", "read_processor_info", "write_processor_info"]
