"""A transaction's buffered writes: point operations, cleared ranges and batches, composed
so that reads see them before the commit applies them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, cast

from millstream.state.keys import (
    EncodedKeys,
    add_int64s,
    decode_int64,
    encode_int64,
    fold_int64s,
    wrap_int64,
)

SET, CLEAR, ADD = 0, 1, 2
"""Kinds of a point write."""


def add_bytes(base: bytes | None, delta: int) -> bytes:
    """``base`` (an 8-byte value or nothing) plus ``delta``, as atomic add computes it."""
    return encode_int64(wrap_int64((decode_int64(base) if base else 0) + delta))


def apply_adds(base: bytes | None, deltas: list[int | bytes]) -> bytes:
    """``base`` after the pending adds ``deltas`` in order: ints (:meth:`add`) or int64
    lanes (:func:`~millstream.state.add_int64s`)."""
    value = base
    for delta in deltas:
        value = add_int64s(value, delta) if isinstance(delta, bytes) else add_bytes(value, delta)
    assert value is not None
    return value


@dataclass
class PointOps:
    """Consecutive single-key writes, composed per key: kind is SET, CLEAR or ADD."""

    ops: dict[bytes, tuple[int, Any]] = field(default_factory=dict)


@dataclass
class ClearRange:
    begin: bytes
    end: bytes


@dataclass
class BatchSet:
    keys: list[bytes]
    values: list[bytes]
    _index: dict[bytes, bytes] | None = None

    def index(self) -> dict[bytes, bytes]:
        if self._index is None:
            self._index = dict(zip(self.keys, self.values, strict=True))
        return self._index


@dataclass
class BatchAdd:
    """An ``add_many``: int deltas (one counter per key) or int64 lanes (several, as bytes)."""

    keys: Sequence[bytes]
    deltas: list[int] | list[bytes]
    _index: dict[bytes, Any] | None = None
    _bounds: tuple[bytes, bytes] | None = None

    def may_hold(self, key: bytes) -> bool:
        """Whether ``key`` may be one of the batch's: False only if it is outside the
        least and the greatest key (known without a dict of every key when the keys are
        :class:`~millstream.state.keys.EncodedKeys`: a reducer's reads of its own state
        after a big ``add_many`` do not build one)."""
        if not isinstance(self.keys, EncodedKeys) or not self.keys:
            return True
        if self._bounds is None:
            self._bounds = self.keys.bounds()
        return self._bounds[0] <= key <= self._bounds[1]

    @property
    def lanes(self) -> bool:
        return bool(self.deltas) and isinstance(self.deltas[0], bytes)

    @property
    def width(self) -> int:
        """Counters per key: int64 lanes, or 1 for int deltas."""
        return len(cast(bytes, self.deltas[0])) // 8 if self.lanes else 1

    def index(self) -> dict[bytes, Any]:
        if self._index is None:
            if self.lanes:
                self._index = fold_int64s(self.keys, cast(list[bytes], self.deltas))
                return self._index
            ints = cast(list[int], self.deltas)
            index: dict[bytes, int] = dict(zip(self.keys, ints, strict=True))
            if len(index) != len(self.keys):
                index = {}
                for k, d in zip(self.keys, ints, strict=True):
                    index[k] = index.get(k, 0) + d
            self._index = index
        return self._index


Op = PointOps | ClearRange | BatchSet | BatchAdd


def run_stretches(log: Sequence[Op], min_keys: int) -> list[list[BatchAdd]]:
    """The ``add_many`` batches of ``log`` that become runs, one run per stretch: batches
    of one width next to each other in the log (nothing written between them), holding at
    least ``min_keys`` keys together (0: no runs).

    A reducer that adds a pane's or a group's counters with one ``add_many`` each makes
    dozens of batches in one commit; as one run each they would pile up faster than the
    merger folds them. Adds of one width commute, so a stretch is one run at its place.
    """
    if min_keys <= 0:
        return []
    stretches: list[list[BatchAdd]] = []
    for width, ops in groupby(log, key=lambda op: op.width if isinstance(op, BatchAdd) else 0):
        batches = cast(list[BatchAdd], list(ops))
        if width and sum(len(batch.keys) for batch in batches) >= min_keys:
            stretches.append(batches)
    return stretches


def compose(prev: tuple[int, Any] | None, kind: int, payload: Any) -> tuple[int, Any]:
    """A point write followed by another on the same key, as one write."""
    if kind != ADD or prev is None:
        return kind, payload
    prev_kind, prev_payload = prev
    if prev_kind == SET:
        return SET, add_bytes(prev_payload, payload)
    if prev_kind == CLEAR:
        return SET, add_bytes(None, payload)
    return ADD, wrap_int64(prev_payload + payload)
