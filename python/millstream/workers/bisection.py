"""Bisection: the rows of a batch that the user's code raises on, found by halving.

``on_user_error="dead_letter"`` sets those rows aside (:mod:`millstream.ledger.dead_letters`)
and lets the rest go on. Bisection starts only after the whole batch raised, so a batch
that does not raise costs nothing more. A half that runs is kept whole; a half that raises
is halved again, down to single rows: ``k`` bad rows among ``n`` cost about
``2 k log2(n / k)`` calls. The code is then run once on the kept rows together; should that
raise again (the code fails on some rows only in company), the search goes on in them.
Code that raises on a batch but on none of its rows alone cannot be split this way: that
stops with an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import pyarrow as pa

from millstream.exceptions import UserCodeError

T = TypeVar("T")


@dataclass(frozen=True)
class Split(Generic[T]):
    """A batch split into the rows the code ran on and those it raised on.

    Attributes:
        result: What the code returned on :attr:`kept` (None when no row is kept).
        kept: The rows it ran on, in the batch's order.
        failures: ``(position in the batch, what the code raised on that row alone)``, in
            the batch's order.
    """

    result: T | None
    kept: pa.RecordBatch
    failures: list[tuple[int, BaseException]]


def split_off_failures(
    batch: pa.RecordBatch,
    attempt: Callable[[pa.RecordBatch], T],
    error: BaseException,
    *,
    passes: tuple[type[BaseException], ...] = (),
    what: str = "the code",
) -> Split[T]:
    """Find the rows of ``batch`` that ``attempt`` raises on, knowing it raised ``error``
    on the whole batch.

    Args:
        batch: The rows.
        attempt: The user's code on some of them (deterministic: the same rows, the same
            outcome).
        error: What ``attempt`` raised on ``batch``.
        passes: Errors that are not the rows' fault (the store's): raised as they come.
        what: Names the code and the batch in the error below.

    Raises:
        UserCodeError: ``attempt`` raises on some rows together but on none alone.
    """
    remaining = np.arange(batch.num_rows)
    failures: list[tuple[int, BaseException]] = []
    while True:
        found = _bisect(batch, remaining, attempt, error, passes)
        if not found:
            raise UserCodeError(
                f"{what} raised on {len(remaining)} rows together ({error!r}) but on none of "
                "them alone, so they cannot be set aside as dead letters. Make it fail row by "
                "row, or use on_user_error='stop'"
            ) from error
        failures.extend(found)
        bad = np.array([position for position, _ in found])
        remaining = remaining[~np.isin(remaining, bad)]
        failures.sort(key=lambda failure: failure[0])
        if not len(remaining):
            return Split(None, batch.slice(0, 0), failures)
        kept = batch.take(pa.array(remaining))
        try:
            return Split(attempt(kept), kept, failures)
        except passes:
            raise
        except Exception as exc:
            error = exc


def _bisect(
    batch: pa.RecordBatch,
    rows: np.ndarray,
    attempt: Callable[[pa.RecordBatch], object],
    error: BaseException,
    passes: tuple[type[BaseException], ...],
) -> list[tuple[int, BaseException]]:
    """The rows among ``rows`` (positions; ``attempt`` raised ``error`` on them together)
    that ``attempt`` raises on alone."""
    if len(rows) == 1:
        return [(int(rows[0]), error)]
    found = []
    middle = len(rows) // 2
    for half in (rows[:middle], rows[middle:]):
        try:
            attempt(batch.take(pa.array(half)))
        except passes:
            raise
        except Exception as exc:
            found.extend(_bisect(batch, half, attempt, exc, passes))
    return found


__all__ = ["Split", "split_off_failures"]
