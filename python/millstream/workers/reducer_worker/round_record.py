"""The round record: what one reducer transaction commits besides the user's writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from millstream.ledger import ReducerState


@dataclasses.dataclass(frozen=True)
class Round:
    """What one reducer transaction commits besides the user's writes.

    Attributes:
        state: The committed indices to write.
        rows: Rows the transaction covers (reduced, or finished by a queue reducer).
        consumed: Spilled rows the transaction holds (mapper: shuffle index): their chunks
            are cleared in it.
    """

    state: ReducerState
    rows: int
    consumed: Mapping[int, int]
