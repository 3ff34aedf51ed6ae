"""FoundationDB's transaction limits, enforced by every backend.

The embedded SQLite store could accept far larger transactions, but a job that passes
locally must also pass on FoundationDB, so both backends refuse the same things with the
same errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from millstream.exceptions import (
    KeyTooLargeError,
    TransactionTooLargeError,
    TransactionTooOldError,
    ValueTooLargeError,
)


@dataclass(frozen=True)
class StoreLimits:
    """Size and time limits of one transaction (defaults: FoundationDB's).

    Attributes:
        max_key_bytes: Largest key, prefix included.
        max_value_bytes: Largest value.
        max_transaction_bytes: Largest transaction: keys and values written, ranges cleared
            and keys and ranges read with conflict checking (approximately FoundationDB's
            ``get_approximate_size``).
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
