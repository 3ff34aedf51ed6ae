"""FoundationDB's transaction limits, enforced by every backend.

The embedded SQLite store could accept far larger transactions, but a job that passes
locally must also pass on FoundationDB, so both backends refuse the same things with the
same errors: a key, a value, a transaction's age, and a transaction's size counted as
FoundationDB counts it (:func:`write_bytes` and the functions beside it).

One exception: a *splittable* transaction, whose caller splits its work when it is too
large (a reducer's commit of several rows: it fetches fewer rows next time), is held to the
limit by what its backend can take. On FoundationDB that is the same count; SQLite has no
size limit of its own, so there it counts the bytes it stores (keys and values written,
keys read, range bounds), and its commits hold more rows than FoundationDB's would. What
cannot be split, any other transaction and a reducer's commit of one row, is held to
FoundationDB's count on both. The one thing SQLite does not catch: a single row whose
writes pass FoundationDB's limit, reduced within a commit of several rows (FoundationDB
refuses it once the reducer has shrunk its fetch to that row; SQLite only if it is ever
committed alone). :attr:`Store.limits_transaction_size` says which kind a backend is.
"""

from __future__ import annotations

from dataclasses import dataclass

from millstream.exceptions import (
    KeyTooLargeError,
    TransactionTooLargeError,
    TransactionTooOldError,
    ValueTooLargeError,
)

MUTATION_BYTES = 68
"""What FoundationDB counts for a write beyond its bytes: the mutation's and its write
conflict range's records (measured with ``get_approximate_size`` on 7.3: a set or atomic
add of key ``k`` and value ``v`` counts ``k + v`` for the mutation, ``2k + 1`` for its
conflict range ``[k, k + b"\\x00")`` and this)."""

CLEAR_BYTES = 48
"""The same for a clear of one key (a clear of ``[k, k + b"\\x00")``, measured alike)."""

READ_CONFLICT_BYTES = 24
"""What FoundationDB counts for a read conflict range beyond its two keys."""


def write_bytes(keys: int, key_bytes: int, value_bytes: int) -> int:
    """FoundationDB's size of ``keys`` sets or atomic adds of ``key_bytes`` key and
    ``value_bytes`` value bytes in all."""
    return 3 * key_bytes + value_bytes + keys * (1 + MUTATION_BYTES)


def clear_bytes(keys: int, key_bytes: int) -> int:
    """FoundationDB's size of ``keys`` single-key clears of ``key_bytes`` bytes in all."""
    return 4 * key_bytes + keys * (2 + CLEAR_BYTES)


def clear_range_bytes(begin: int, end: int) -> int:
    """FoundationDB's size of a range clear of bounds of ``begin`` and ``end`` bytes."""
    return 2 * (begin + end) + MUTATION_BYTES


def read_bytes(keys: int, key_bytes: int) -> int:
    """FoundationDB's size of the read conflicts of ``keys`` single-key reads."""
    return 2 * key_bytes + keys * (1 + READ_CONFLICT_BYTES)


def read_range_bytes(begin: int, end: int) -> int:
    """FoundationDB's size of a range read's conflict (its bounds; a read with a limit
    conflicts on less, so this is an upper bound)."""
    return begin + end + READ_CONFLICT_BYTES


@dataclass(frozen=True)
class StoreLimits:
    """Size and time limits of one transaction (defaults: FoundationDB's).

    Attributes:
        max_key_bytes: Largest key, prefix included.
        max_value_bytes: Largest value.
        max_transaction_bytes: Largest transaction, counted as FoundationDB counts it
            (``get_approximate_size``): each write's key and value, its conflict range and
            a fixed overhead, ranges cleared, and keys and ranges read with conflict
            checking (:func:`write_bytes` and the functions beside it).
        max_transaction_seconds: Longest time from a transaction's first operation to its
            commit.
    """

    max_key_bytes: int = 10_000
    max_value_bytes: int = 100_000
    max_transaction_bytes: int = 10_000_000
    max_transaction_seconds: float = 5.0

    def check_key(self, key: bytes) -> None:
        """Raise :class:`KeyTooLargeError` if ``key`` is too large."""
        if len(key) > self.max_key_bytes:
            raise KeyTooLargeError(
                f"key of {len(key)} bytes exceeds the {self.max_key_bytes}-byte key limit "
                f"(FoundationDB's); key starts {key[:64]!r}. Use shorter key elements, e.g. "
                "a hash of a long string."
            )

    def check_value(self, key: bytes, size: int) -> None:
        """Raise :class:`ValueTooLargeError` if a value of ``size`` bytes is too large."""
        if size > self.max_value_bytes:
            raise ValueTooLargeError(
                f"value of {size} bytes at key {key[:64]!r} exceeds the "
                f"{self.max_value_bytes}-byte value limit (FoundationDB's). Split the value "
                "over several keys."
            )

    def check_size(self, size: int) -> None:
        """Raise :class:`TransactionTooLargeError` if ``size`` exceeds the transaction limit."""
        if size > self.max_transaction_bytes:
            raise TransactionTooLargeError(
                f"transaction size {size} bytes exceeds the {self.max_transaction_bytes}-byte "
                "transaction limit (FoundationDB's). Commit more often: lower the reducer "
                "batch size (rows or bytes per commit) or split the writes over several "
                "transactions.",
                size=size,
                limit=self.max_transaction_bytes,
            )

    def check_age(self, elapsed: float) -> None:
        """Raise :class:`TransactionTooOldError` if a transaction has run too long."""
        if elapsed > self.max_transaction_seconds:
            raise TransactionTooOldError(
                f"transaction ran {elapsed:.2f} s, longer than the "
                f"{self.max_transaction_seconds:g} s limit (FoundationDB's). Do less work per "
                "transaction: lower the reducer batch size or move slow work out of it."
            )


DEFAULT_LIMITS = StoreLimits()
