"""Fetch sizing: how many rows and bytes a reducer's next fetch asks for, so that its
transaction stays within the store's limits (nothing to do with a rescale)."""

from __future__ import annotations


class FetchSizing:
    """How much the next fetch asks for, so that its transaction stays within the store's
    limits (nothing to do with a rescale of the processor's reducers).

    Attributes:
        scale: The share of ``Tuning.commit_max_rows`` and ``commit_max_bytes`` fetched
            (1: all; smaller after a transaction that was too large).
        row_bytes: Arrow bytes per fetched row, recently (0: not known yet).
    """

    def __init__(self) -> None:
        self.scale = 1.0
        self.row_bytes = 0.0

    def resize(self, size: int | None, limit: int | None, *, failed: bool = False) -> None:
        """Size the next fetch so that the transaction's writes stay below the store's limit.

        After a transaction that was too large, the fetch shrinks at least by half, and in
        proportion when the size at which it failed is known. After a commit that was capped
        below the full fetch, it grows in proportion to the room its writes left (at most
        fourfold, aiming at 90 % of the limit).
        """
        scale = self.scale
        ratio = 0.9 * limit / size if size and limit else None
        if failed:
            scale *= min(0.5, ratio) if ratio is not None else 0.5
        elif scale < 1.0 or (ratio is not None and ratio < 1.0):
            scale *= min(4.0, max(0.5, ratio)) if ratio is not None else 1.25
        self.scale = min(1.0, max(scale, 1e-9))
