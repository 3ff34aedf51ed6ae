"""Straggler spill (thesis section 6): rows the window holds only for reducers that stopped
calling GetRows are written to the store (:mod:`millstream.ledger.spill`), so that the
mapper reads on and the other reducers keep committing."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from millstream.ledger.spill import write_spill_chunk
from millstream.workers.fencing import check_claims
from millstream.workers.mapper_worker.instance import MapperInstance

log = logging.getLogger("millstream.mapper")

SPILL_TO_SHARE = 0.5
"""A straggler spill empties the window down to this share of its memory limit."""

SPILL_CHUNK_SHARE = 0.9
"""A spilled chunk takes at most this share of the store's value limit."""


class StragglerSpill(MapperInstance):
    """The mapper's straggler spill (a part of :class:`MapperWorker`)."""

    def stragglers(self) -> list[int]:
        """Reducers that have not called GetRows for ``spill_after_seconds`` (down, hung or
        cut off; a reducer in a held call or a short commit calls again well within it)."""
        after = self.tuning.spill_after_seconds
        if after is None:
            return []
        now = self.clock.now()
        return [r for r, at in enumerate(self._last_call) if now - at >= after]

    def spill_stragglers(
        self, stragglers: Sequence[int] | None = None, target_bytes: int | None = None
    ) -> int:
        """Write to the store the rows the window holds only for ``stragglers`` (default:
        :meth:`stragglers`), from its oldest entries that another reducer has moved past,
        and let the window go of them, down to ``target_bytes`` (default: half of its
        memory limit): the mapper reads on and the other reducers keep committing while a
        reducer is down. Rows the other
        reducers committed are never written. A straggler reads its rows from the store
        before the window's (:mod:`millstream.ledger.spill`) and clears them in the
        transaction that commits them; the mapper's persisted state and its input's trim
        move past them.

        Returns:
            Rows spilled (0: nothing qualified, e.g. a reducer that is not a straggler still
            needs the oldest entry).

        Raises:
            SplitBrainError: Another instance wrote this mapper's state.
        """
        state = self.serving  # the window and the claims made against it, together
        window = self._require_window(state)
        stragglers = self.stragglers() if stragglers is None else list(stragglers)
        if not stragglers:
            return 0
        limits = self.store.limits
        if target_bytes is None:
            target_bytes = int(window.snapshot().memory_limit_bytes * SPILL_TO_SHARE)
        chunks = window.peek_spill(
            stragglers,
            target_bytes,
            min(self.tuning.commit_max_bytes, limits.max_transaction_bytes // 2),
            int(limits.max_value_bytes * SPILL_CHUNK_SHARE),
        )
        if not chunks:
            return 0
        claims = state.claims.snapshot()  # after the peek: covers every pop it reflects
        txn = self.store.create_transaction()
        try:
            self._verify_persisted(txn)
            # A reducer reads spilled rows straight from the store, right after what it
            # committed: a bucket popped past that (a false claim) must not spill.
            check_claims(txn, self.index, self.processor.num_partitions, claims)
            for reducer, _, last, _, payload in chunks:
                write_spill_chunk(txn, reducer, self.index, last, payload)
            txn.commit()
        except BaseException:
            txn.reset()
            raise
        through: dict[int, int] = {}
        for reducer, _, last, _, _ in chunks:
            through[reducer] = max(last, through.get(reducer, -1))
        for reducer, last in through.items():
            window.mark_spilled(reducer, last)
        rows = sum(c[3] for c in chunks)
        size = sum(len(c[4]) for c in chunks)
        self.spills += 1
        self.rows_spilled += rows
        self.bytes_spilled += size
        log.info(
            "mapper %d: window full, spilled %d rows (%d bytes) for reducer(s) %s, silent for "
            "%s s or more",
            self.index,
            rows,
            size,
            sorted(through),
            self.tuning.spill_after_seconds,
        )
        return rows
