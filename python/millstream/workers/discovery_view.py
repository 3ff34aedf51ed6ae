"""What one worker knows of discovery: live entries judged on its own monotonic clock.

Hosts' clocks need not agree, so nothing here compares wall-clock times. An entry is live
while its beat counter keeps changing as this observer sees it; one whose counter stayed
the same for :data:`EXPIRY_HEARTBEATS` heartbeat periods of this observer's clock is dead.
Among the live entries of an index, the newest registration is the current instance.
"""

from __future__ import annotations

from millstream.ledger import WorkerInfo, freshest_workers
from millstream.workers.clock import Clock

EXPIRY_HEARTBEATS = 10
"""Heartbeat periods without a beat after which an entry counts as dead (as in
``millstream status``)."""


class DiscoveryView:
    """An observer's view of one role's discovery entries.

    Args:
        clock: The observer's clock (only its monotonic ``now`` is used).
        heartbeat_seconds: The workers' heartbeat period.
        expiry_heartbeats: Periods without a beat after which an entry is dead.
    """

    def __init__(
        self, clock: Clock, heartbeat_seconds: float, expiry_heartbeats: int = EXPIRY_HEARTBEATS
    ) -> None:
        self._clock = clock
        self._timeout = heartbeat_seconds * expiry_heartbeats
        # (index, guid) -> ((registration, beats) last seen, when it last changed)
        self._seen: dict[tuple[int, str], tuple[tuple[int, int], float]] = {}

    def observe(self, entries: list[WorkerInfo]) -> tuple[dict[int, WorkerInfo], list[WorkerInfo]]:
        """Take in a fresh read of discovery.

        Returns:
            The current instance of every index that has a live entry, and the entries
            found dead (to be removed with
            :func:`~millstream.ledger.remove_stale_workers`).
        """
        now = self._clock.now()
        seen: dict[tuple[int, str], tuple[tuple[int, int], float]] = {}
        live: list[WorkerInfo] = []
        dead: list[WorkerInfo] = []
        for info in entries:
            key, mark = (info.index, info.guid), (info.registration, info.beats)
            before = self._seen.get(key)
            since = before[1] if before is not None and before[0] == mark else now
            seen[key] = (mark, since)
            (dead if now - since >= self._timeout else live).append(info)
        self._seen = seen
        return freshest_workers(live), dead


__all__ = ["EXPIRY_HEARTBEATS", "DiscoveryView"]
