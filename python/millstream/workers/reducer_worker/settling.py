"""Files of reducer commits whose outcome is unknown, published once the store tells.

A commit reported unknown (:class:`~millstream.exceptions.CommitUnknownResultError`) may
have landed, or may still land: its staged files can be neither published nor deleted
when it is reported. The reducer holds them here and settles them on its next rounds,
reading the store:

- a commit whose file records are in the store landed: its files are published;
- a commit whose records are missing after a later commit of the same kind by this
  reducer landed, one that changed what it read (the reducer's state or its drained
  marker), never will: the store refuses it as a conflict, the value it read being gone
  for good (committed indices only grow; the marker stays). Its files are deleted;
- otherwise it stays held. A held file whose record lands later still gets published by
  the next instance's or the drain's :func:`~millstream.outputs.finish_publishing`, and
  one never recorded is removed by :meth:`~millstream.outputs.ParquetSink.vacuum`.
"""

from __future__ import annotations

import dataclasses

from millstream.outputs import StagedOutputs
from millstream.state import Store

ROUND = "round"
"""A commit of a reducer round: it read and wrote the reducer's state."""

DRAIN = "drain"
"""A reducer's drain commit: it read and wrote the reducer's drained marker."""


@dataclasses.dataclass
class _Held:
    outputs: StagedOutputs
    kind: str
    read: object
    superseded: bool = False


class UnsettledOutputs:
    """One reducer instance's commits whose outcome is unknown, with staged files."""

    def __init__(self) -> None:
        self._held: list[_Held] = []

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, outputs: StagedOutputs, kind: str, read: object) -> None:
        """Keep the files of a commit of ``kind`` (:data:`ROUND`, :data:`DRAIN`) that was
        reported unknown, until the store tells whether it landed; ``read``: the value of
        the reducer's state (or drained marker) it read."""
        if outputs.files_staged:
            self._held.append(_Held(outputs, kind, read))

    def committed(self, kind: str, wrote: object) -> None:
        """A later commit of ``kind`` by this reducer landed, writing ``wrote`` where the
        held ones read: those that read another value have landed by now or never will."""
        for held in self._held:
            if held.kind == kind and held.read != wrote:
                held.superseded = True

    def settle(self, store: Store) -> list[StagedOutputs]:
        """Publish the held files whose commit landed and delete those whose commit never
        will; returns the outputs published (one read of the store).

        Raises:
            RetryableStoreError, StoreUnavailableError: The store failed; nothing changed.
        """
        if not self._held:
            return []
        with store.read() as txn:
            landed = [held.outputs.landed_in(txn) for held in self._held]
        published = []
        keep = []
        for held, did in zip(self._held, landed, strict=True):
            if did:
                held.outputs.publish()
                published.append(held.outputs)
            elif held.superseded:
                held.outputs.discard()
            else:
                keep.append(held)
        self._held = keep
        return published
