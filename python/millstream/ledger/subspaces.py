"""Where the protocol's records live: a processor's store prefix (:func:`processor_prefix`),
and the subspaces under it.

- ``SYSTEM + ("mapper", m)``: persisted state of mapper ``m`` (:mod:`.mapper`).
- ``SYSTEM + ("plan", m, begin)``, ``("drained", m)``, ``("mapped", m, what)``: mapper
  ``m``'s batch plans, drained marker and totals (:mod:`.mapper`).
- ``SYSTEM + ("reducer", r)``, ``("reduced", r, what)``: committed row indices and totals
  of reducer ``r`` (:mod:`.reducer`).
- ``SYSTEM + ("workers", role, index, guid)``, ``("registrations", role)``,
  ``("status", role, index)``: discovery entries and worker metrics (:mod:`.discovery`).
- ``SYSTEM + ("dead-letter", stage, ...)``, ``("dead-letter-count", stage, worker)``: rows
  ``map`` or ``reduce`` raised on, and how many per worker (:mod:`.dead_letters`).
- ``SYSTEM + ("processor",)``: counts and fingerprint of the processor
  (:mod:`.processor_record`); ``SYSTEM + ("rescale",)``: an unfinished rescale
  (:mod:`.rescale`).
- ``OUTPUT + ...``: the user's reducer output; ``QUEUES + ...``: store-backed queues;
  ``SINKS + ...``: the files each file sink published.

Records are encoded with the tuple layer (states) or JSON (metrics, metadata), both stable.
"""

from __future__ import annotations

from millstream.exceptions import StoreCorruptError


def processor_prefix(name: str) -> tuple[str]:
    """The store prefix every record of the processor named ``name`` lives under."""
    return (name,)


SYSTEM: tuple[str] = ("sys",)
"""Subspace of millstream's own records."""

OUTPUT: tuple[str] = ("out",)
"""Subspace for the user's output (reducers write under it)."""

QUEUES: tuple[str] = ("queue",)
"""Subspace of store-backed input queues."""

SINKS: tuple[str] = ("sink",)
"""Subspace of the records of file sinks (which files a commit published)."""

ROLES = ("mapper", "reducer")
"""The two worker roles."""


def bad_record(what: str, raw: bytes, exc: Exception) -> StoreCorruptError:
    """The error for a stored record that does not decode."""
    return StoreCorruptError(f"cannot decode the stored {what} ({raw[:64]!r}): {exc}")


def check_role(role: str) -> None:
    """Refuse a role other than ``mapper`` or ``reducer``."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
