"""Key groups: how a key reaches its reducer, and what a rescale moves.

A key hashes (a fixed, documented hash in the Rust core) to one of a processor's key
groups, fixed when the processor is created (:data:`DEFAULT_KEY_GROUPS` unless it chooses
its own); reducer ``r`` of ``n`` owns a contiguous range of them (:func:`key_group_range`).
State a reducer keeps by key, or under its key's group, stays where it is when a rescale
hands whole ranges to other reducers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from millstream import _core

DEFAULT_KEY_GROUPS = 128
"""Key groups of a processor that does not choose its own: the most reducers it can be
rescaled to."""


def key_group_range(index: int, num_reducers: int, key_groups: int) -> range:
    """The key groups reducer ``index`` of ``num_reducers`` owns."""
    g, r = key_groups, num_reducers
    return range(-(-index * g // r), -(-(index + 1) * g // r))


def reducer_of_key_groups(groups: pa.Array, num_reducers: int, key_groups: int) -> pa.Array:
    """The reducer (int32) owning each of ``groups``: reducer ``r`` owns the contiguous
    range :func:`key_group_range` gives."""
    owned = groups.to_numpy(zero_copy_only=False).astype("int64")
    return pa.array((owned * num_reducers // key_groups).astype("int32"))


def route_by_hash(
    batch: pa.RecordBatch,
    keys: list[str],
    num_reducers: int,
    key_groups: int,
    *,
    canonical_order: bool,
) -> tuple[pa.RecordBatch, pa.Array]:
    """Each row's reducer by the hash of its ``keys`` columns, through its key group; with
    ``canonical_order``, the rows put in the order of their key hashes first.

    Returns:
        The rows (reordered or not) and one reducer index (int32) per row.
    """
    # Both map a hash h onto [0, n) as floor(h * n / 2**64): when num_reducers divides
    # key_groups, the reducer of h's key group is the reducer of h itself.
    exact = key_groups % num_reducers == 0
    n = num_reducers if exact else key_groups
    if not canonical_order:
        indices = _core.hash_partition(batch, keys, n)
    else:
        order, indices = _core.hash_partition_ordered(batch, keys, n)
        batch = batch.take(order)
    if not exact:
        indices = reducer_of_key_groups(indices, num_reducers, key_groups)
    return batch, indices


def key_groups_of(table: pa.Table, key: str, key_groups: int) -> np.ndarray:
    """The key group (int64) of each row's ``key`` column, as :func:`route_by_hash`
    computes it."""
    keys = table.select([key]).combine_chunks().to_batches()
    if not keys:
        return np.zeros(0, dtype=np.int64)
    groups = _core.hash_partition(keys[0], [key], key_groups)
    return np.asarray(groups.to_numpy(zero_copy_only=False), dtype=np.int64)


__all__ = [
    "DEFAULT_KEY_GROUPS",
    "key_group_range",
    "key_groups_of",
    "reducer_of_key_groups",
    "route_by_hash",
]
