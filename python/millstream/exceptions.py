"""The millstream exception hierarchy.

Every error millstream raises derives from :class:`MillstreamError`. Messages say what was
wrong and what to do about it. The window errors are created by the Rust core and re-exported
here unchanged.
"""

from millstream._core import (
    CommittedIndexError,
    MemoryLimitError,
    MillstreamError,
    SchemaMismatchError,
    WindowError,
)


class ConfigurationError(MillstreamError):
    """The processor is misconfigured (counts, URLs, slots); raised before anything starts."""


class StoreError(MillstreamError):
    """A state store operation failed."""


class RetryableStoreError(StoreError):
    """A store error after which retrying the whole transaction is correct."""


class StoreConflictError(RetryableStoreError):
    """The transaction read data that another transaction changed before it committed."""


class CommitUnknownResultError(RetryableStoreError):
    """The commit may or may not have been applied (FoundationDB error 1021)."""


class TransactionTooOldError(RetryableStoreError):
    """The transaction ran longer than the store allows (five seconds, as in FoundationDB)."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached or opened (down, locked, missing client library)."""


class StoreCorruptError(StoreError):
    """The store's files are damaged or not a millstream store."""


class StoreLimitError(StoreError):
    """A key, value or transaction exceeds the store's limits (FoundationDB's, everywhere)."""


class TransactionTooLargeError(StoreLimitError):
    """A transaction's writes exceed the size limit (10 MB, as in FoundationDB).

    Attributes:
        size: Bytes the transaction reached when it crossed the limit (``None``: unknown).
        limit: The limit in bytes (``None``: unknown).
    """

    def __init__(self, message: str, *, size: int | None = None, limit: int | None = None):
        super().__init__(message)
        self.size = size
        self.limit = limit


class KeyTooLargeError(StoreLimitError):
    """A key exceeds 10 kB."""


class ValueTooLargeError(StoreLimitError):
    """A value exceeds 100 kB."""


class SplitBrainError(MillstreamError):
    """Another live instance of the same worker changed its persisted state."""


class WindowLostRowsError(SplitBrainError):
    """A reducer claimed a committed index the store does not hold: the mapper dropped rows
    that no reducer committed (a forged GetRows, or a reducer that broke the protocol).

    The mapper restarts from its persisted state, which it never moves past what the store
    says the reducers committed, so it produces the dropped rows again: nothing is lost.
    """


class MapperSupersededError(SplitBrainError):
    """At-least-once: a newer instance of the mapper took over its numbering; this one stops
    (its rows can no longer be committed, and the newer one reads them again)."""


class StaleMapperError(MillstreamError):
    """A GetRows request named a mapper GUID that is not the serving mapper's."""


class UserCodeError(MillstreamError):
    """The user's ``map`` or ``reduce`` raised; the message names the worker and row range."""


class DeadLetterCapError(UserCodeError):
    """More rows became dead letters than ``Tuning.dead_letter_max_rows`` or
    ``dead_letter_max_share`` allow: the run stops anyway, committing nothing of the batch
    that went past the cap."""


class CrashLoopError(MillstreamError):
    """A worker died more often than the restart strategy allows; names its last error."""


class InputError(MillstreamError):
    """An input partition is unreadable: a corrupt file, a schema change, a missing row."""


class SchemaEvolutionError(MillstreamError):
    """A schema change that is not safe (:mod:`millstream.schema_unification`): a type
    narrowed or changed, a non-null column added. Inputs raise it as an
    :class:`InputError`, a mapper's changing output as a :class:`UserCodeError`, each
    saying where; this one says which column and how.

    Attributes:
        column: The column's name.
        before: Its type before (or in one of two schemas).
        after: Its type after (or in the other).
        reason: Why the change is refused.
    """

    def __init__(self, column: str, before: str, after: str, reason: str) -> None:
        super().__init__(f"column {column!r} changed from {before} to {after}: {reason}")
        self.column = column
        self.before = before
        self.after = after
        self.reason = reason

    def __reduce__(self) -> "tuple[type[SchemaEvolutionError], tuple[str, str, str, str]]":
        return (type(self), (self.column, self.before, self.after, self.reason))


class DuplicateSequenceError(InputError):
    """A queue producer repeated a sequence number older than its last one: appended before.

    Attributes:
        last_sequence: The producer's last sequence number in the partition.
    """

    def __init__(self, message: str, *, last_sequence: int) -> None:
        super().__init__(message)
        self.last_sequence = last_sequence


FATAL_ERRORS: tuple[type[MillstreamError], ...] = (
    UserCodeError,
    ConfigurationError,
    InputError,
    StoreCorruptError,
    StoreLimitError,
)
"""Errors a restart cannot cure: a worker that raises one reports it and the run stops."""


__all__ = [
    "FATAL_ERRORS",
    "CommitUnknownResultError",
    "CommittedIndexError",
    "ConfigurationError",
    "CrashLoopError",
    "DeadLetterCapError",
    "DuplicateSequenceError",
    "InputError",
    "KeyTooLargeError",
    "MapperSupersededError",
    "MemoryLimitError",
    "MillstreamError",
    "RetryableStoreError",
    "SchemaEvolutionError",
    "SchemaMismatchError",
    "SplitBrainError",
    "StaleMapperError",
    "StoreConflictError",
    "StoreCorruptError",
    "StoreError",
    "StoreLimitError",
    "StoreUnavailableError",
    "TransactionTooLargeError",
    "TransactionTooOldError",
    "UserCodeError",
    "ValueTooLargeError",
    "WindowError",
    "WindowLostRowsError",
]
