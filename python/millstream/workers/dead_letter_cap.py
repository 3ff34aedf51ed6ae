"""The dead-letter cap: how many rows may become dead letters before the run stops anyway
(``Tuning.dead_letter_max_rows`` and ``dead_letter_max_share``), checked in the transaction
that writes them."""

from __future__ import annotations

from millstream.exceptions import DeadLetterCapError
from millstream.ledger.dead_letters import DeadLetter, dead_letter_counts, record_dead_letters
from millstream.state import StoreTransaction
from millstream.tuning import Tuning


def record_within_cap(
    txn: StoreTransaction, letters: list[DeadLetter], tuning: Tuning, rows: int, where: str
) -> int:
    """Write ``letters`` in ``txn`` (:func:`record_dead_letters`), unless that takes the
    processor past the cap.

    Args:
        txn: The transaction that commits them.
        letters: One worker's dead letters, from one batch.
        tuning: Says the cap.
        rows: The rows that worker has handled, this batch's included (the share's base).
        where: Names the worker and the batch in the error.

    Returns:
        How many records were new.

    Raises:
        DeadLetterCapError: The cap is passed; reset ``txn`` (commit nothing of the batch).
    """
    if not letters:
        return 0
    counts = dead_letter_counts(txn)  # before this batch's: an add is not read back everywhere
    new = record_dead_letters(txn, letters)
    total = sum(counts.values()) + new
    mine = counts.get((letters[0].stage, letters[0].worker), 0) + new
    cap, share = tuning.dead_letter_max_rows, tuning.dead_letter_max_share
    if cap is not None and total > cap:
        passed = f"{total} dead letters in the processor, over tuning.dead_letter_max_rows ({cap})"
    elif share is not None and mine > share * max(rows, 1):
        passed = (
            f"{mine} dead letters among its {rows} rows, over tuning.dead_letter_max_share "
            f"({share:g})"
        )
    else:
        return new
    raise DeadLetterCapError(
        f"{where}: {passed}; nothing of this batch was committed. List them with "
        "`millstream dead-letters <store>`, fix the data or the code, or raise the cap, "
        "and restart the processor"
    )


__all__ = ["record_within_cap"]
