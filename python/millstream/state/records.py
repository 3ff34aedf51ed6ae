"""Typed records millstream keeps in the store (thesis 4.3.2, 4.4.1, 4.5).

Layout under the store's prefix:

- ``SYSTEM + ("mapper", m)``: persisted mapper state of mapper ``m``.
- ``SYSTEM + ("reducer", r)``: committed row indices of reducer ``r``.
- ``SYSTEM + ("workers", role, index, guid)``: discovery entries.
- ``SYSTEM + ("status", role, index)``: worker metrics for ``millstream status``.
- ``SYSTEM + ("processor",)``: counts and fingerprint of the processor.
- ``OUTPUT + ...``: the user's reducer output; ``QUEUES + ...``: store-backed input queues.

Records are encoded with the tuple layer (states) or JSON (metrics, metadata), both stable.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field

from millstream.exceptions import ConfigurationError, StoreCorruptError
from millstream.state.base import Transaction
from millstream.state.keys import pack, unpack

SYSTEM: tuple[str] = ("sys",)
"""Subspace of millstream's own records."""

OUTPUT: tuple[str] = ("out",)
"""Subspace for the user's output (reducers write under it)."""

QUEUES: tuple[str] = ("queue",)
"""Subspace of store-backed input queues."""

ROLES = ("mapper", "reducer")

Metric = float | int | str


def _bad_record(what: str, raw: bytes, exc: Exception) -> StoreCorruptError:
    return StoreCorruptError(f"cannot decode the stored {what} ({raw[:64]!r}): {exc}")


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")


# -- mapper state ---------------------------------------------------------------------


@dataclass(frozen=True)
class MapperState:
    """A mapper's persisted state (thesis 4.3.2).

    Attributes:
        input_unread_row_index: First input row not yet fully processed and committed.
        shuffle_unread_row_index: The same point in the shuffle numbering.
        continuation_token: The partition reader's token at that point.
        version: Incremented by every write, so a mapper detects another instance's write
            (split brain) even when the values repeat.
    """

    input_unread_row_index: int = 0
    shuffle_unread_row_index: int = 0
    continuation_token: bytes = b""
    version: int = 0


def mapper_state_key(mapper_index: int) -> tuple[str, str, int]:
    """The key of mapper ``mapper_index``'s state."""
    return (*SYSTEM, "mapper", mapper_index)


def read_mapper_state(txn: Transaction, mapper_index: int) -> MapperState:
    """Read a mapper's persisted state (the initial state if never written)."""
    raw = txn.get(mapper_state_key(mapper_index))
    if raw is None:
        return MapperState()
    try:
        i, s, token, version = unpack(raw)
        return MapperState(int(i), int(s), bytes(token), int(version))
    except Exception as exc:
        raise _bad_record(f"state of mapper {mapper_index}", raw, exc) from exc


def write_mapper_state(txn: Transaction, mapper_index: int, state: MapperState) -> MapperState:
    """Write a mapper's state with its version bumped past the stored one.

    Returns:
        The state as written (with the new version); compare later reads against it.
    """
    stored = read_mapper_state(txn, mapper_index)
    written = MapperState(
        state.input_unread_row_index,
        state.shuffle_unread_row_index,
        state.continuation_token,
        max(state.version, stored.version) + 1,
    )
    txn.set(
        mapper_state_key(mapper_index),
        pack(
            (
                written.input_unread_row_index,
                written.shuffle_unread_row_index,
                written.continuation_token,
                written.version,
            )
        ),
    )
    return written


# -- reducer state --------------------------------------------------------------------


@dataclass(frozen=True)
class ReducerState:
    """A reducer's persisted state (thesis 4.4.1).

    Attributes:
        committed_row_indices: Per mapper, the last shuffle row index this reducer has
            committed; ``-1`` when nothing from that mapper was committed yet.
    """

    committed_row_indices: tuple[int, ...]

    @classmethod
    def initial(cls, num_mappers: int) -> ReducerState:
        """The state before the first commit."""
        return cls((-1,) * num_mappers)


def reducer_state_key(reducer_index: int) -> tuple[str, str, int]:
    """The key of reducer ``reducer_index``'s state."""
    return (*SYSTEM, "reducer", reducer_index)


def read_reducer_state(txn: Transaction, reducer_index: int, num_mappers: int) -> ReducerState:
    """Read a reducer's persisted state.

    Raises:
        ConfigurationError: The stored state has a different number of mappers.
    """
    raw = txn.get(reducer_state_key(reducer_index))
    if raw is None:
        return ReducerState.initial(num_mappers)
    try:
        indices = tuple(int(i) for i in unpack(raw))
    except Exception as exc:
        raise _bad_record(f"state of reducer {reducer_index}", raw, exc) from exc
    if len(indices) != num_mappers:
        raise ConfigurationError(
            f"reducer {reducer_index} has committed state for {len(indices)} mappers but the "
            f"processor is configured with {num_mappers}; changing the number of mappers of "
            "an existing processor is not supported (use a new store prefix)"
        )
    return ReducerState(indices)


def write_reducer_state(txn: Transaction, reducer_index: int, state: ReducerState) -> None:
    """Write a reducer's state (in the transaction that holds the reducer's output)."""
    txn.set(reducer_state_key(reducer_index), pack(tuple(state.committed_row_indices)))


# -- discovery ------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerInfo:
    """One discovery entry (thesis 4.5).

    Which of several entries of one index is current never depends on clocks agreeing:
    ``registration`` orders instances by when they registered (a counter incremented in
    the registering transaction), and ``beats`` advances with every heartbeat, so that an
    observer can tell a live entry from a dead one on its own clock
    (:class:`millstream.workers.discovery.DiscoveryView`).

    Attributes:
        role: ``"mapper"`` or ``"reducer"``.
        index: The worker's index within its role.
        guid: This instance's GUID (a restarted worker gets a new one).
        address: ``host:port`` of its gRPC server (empty for reducers).
        heartbeat: Wall-clock time (Unix seconds) of its last beat, on its own host's
            clock: for display only, never compared across hosts.
        pid: Process id.
        host: Host name.
        registration: The instance's registration number within its role; a newer
            instance of an index has a larger one.
        beats: How many times the instance refreshed its entry.
    """

    role: str
    index: int
    guid: str
    address: str
    heartbeat: float
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    registration: int = 0
    beats: int = 0


def _workers_prefix(role: str) -> tuple[str, str, str]:
    return (*SYSTEM, "workers", role)


def _worker_key(role: str, index: int, guid: str) -> tuple[str, str, str, int, str]:
    return (*_workers_prefix(role), index, guid)


def _registrations_key(role: str) -> tuple[str, str, str]:
    return (*SYSTEM, "registrations", role)


def _decode_worker(role: str, key: tuple[object, ...], raw: bytes) -> WorkerInfo:
    try:
        index, guid = key[-2], key[-1]
        fields = unpack(raw)
        address, heartbeat, pid, host = fields[:4]
        # Entries written before registrations existed have four fields: they sort first.
        registration, beats = fields[4:6] if len(fields) >= 6 else (0, 0)
        return WorkerInfo(
            role,
            int(index),  # type: ignore[call-overload]
            str(guid),
            str(address),
            float(heartbeat),
            int(pid),
            str(host),
            int(registration),
            int(beats),
        )
    except Exception as exc:
        raise _bad_record(f"discovery entry {key!r}", raw, exc) from exc


def register_worker(
    txn: Transaction,
    role: str,
    index: int,
    guid: str,
    address: str,
    heartbeat: float,
    *,
    pid: int | None = None,
    host: str | None = None,
    registration: int | None = None,
    beats: int | None = None,
) -> WorkerInfo:
    """Create or refresh a discovery entry; call it again to heartbeat.

    A refresh keeps the entry's registration number and advances its beat counter. An
    entry that does not exist yet is created with ``registration`` and a beat counter past
    ``beats`` (an instance whose entry an observer removed while it was still alive passes
    its own, so that observers see its counter advance) or, for a new instance, the next
    registration number of ``role``. A new instance also removes the entries it
    supersedes: older instances of its index (the newest registration is the one reducers
    use; an older one that is still alive re-creates its entry on its next beat) and
    entries of any index at its own address (whoever served there is gone).

    Returns:
        The entry as written.
    """
    _check_role(role)
    key = _worker_key(role, index, guid)
    raw = txn.get(key)
    if raw is not None:
        stored = _decode_worker(role, key, raw)
        registration, beats = stored.registration, stored.beats + 1
    else:
        beats = 0 if beats is None else beats + 1
    if registration is None:
        counter = txn.get(_registrations_key(role))
        registration = (int(unpack(counter)[0]) if counter is not None else 0) + 1
        txn.set(_registrations_key(role), pack((registration,)))
        for other in list_workers(txn, role):
            same_index = other.index == index and other.registration < registration
            same_address = bool(address) and other.address == address
            if other.guid != guid and (same_index or same_address):
                unregister_worker(txn, role, other.index, other.guid)
    info = WorkerInfo(
        role,
        index,
        guid,
        address,
        float(heartbeat),
        os.getpid() if pid is None else pid,
        socket.gethostname() if host is None else host,
        registration,
        beats,
    )
    txn.set(
        key,
        pack(
            (
                info.address,
                info.heartbeat,
                info.pid,
                info.host,
                info.registration,
                info.beats,
            )
        ),
    )
    return info


def unregister_worker(txn: Transaction, role: str, index: int, guid: str) -> None:
    """Remove a discovery entry (a worker leaving cleanly)."""
    _check_role(role)
    txn.clear(_worker_key(role, index, guid))


def list_workers(txn: Transaction, role: str, *, snapshot: bool = True) -> list[WorkerInfo]:
    """Every discovery entry of ``role``, by index then GUID.

    Several entries may share an index (a dead instance and its replacement, thesis 4.5);
    :func:`freshest_workers` picks one per index. Read as a snapshot by default so that
    heartbeats never make the reading transaction conflict.
    """
    _check_role(role)
    return [
        _decode_worker(role, key, raw)
        for key, raw in txn.get_range_startswith(_workers_prefix(role), snapshot=snapshot)
    ]


def freshest_workers(workers: list[WorkerInfo]) -> dict[int, WorkerInfo]:
    """One entry per index: the newest registration (wall-clock times are not compared)."""
    best: dict[int, WorkerInfo] = {}
    for info in workers:
        current = best.get(info.index)
        if current is None or (info.registration, info.guid) > (current.registration, current.guid):
            best[info.index] = info
    return best


def remove_stale_workers(txn: Transaction, stale: list[WorkerInfo]) -> int:
    """Clear the entries an observer found dead, unless they beat since; returns how many.

    Each entry is cleared only if it still holds the registration and beat count the
    observer saw (read in this transaction, so that a concurrent beat makes one of the two
    transactions conflict and the beat wins).
    """
    removed = 0
    for info in stale:
        key = _worker_key(info.role, info.index, info.guid)
        raw = txn.get(key)
        if raw is None:
            continue
        now = _decode_worker(info.role, key, raw)
        if (now.registration, now.beats) == (info.registration, info.beats):
            txn.clear(key)
            removed += 1
    return removed


# -- status ---------------------------------------------------------------------------


def write_worker_status(
    txn: Transaction, role: str, index: int, metrics: dict[str, Metric]
) -> None:
    """Publish a worker's metrics (lag, window size, throughput, ...) for the CLI."""
    _check_role(role)
    for name, value in metrics.items():
        if not isinstance(value, float | int | str):
            raise TypeError(f"metric {name!r} must be a float, int or str; got {value!r}")
    txn.set((*SYSTEM, "status", role, index), json.dumps(metrics, sort_keys=True).encode())


def read_statuses(
    txn: Transaction, *, snapshot: bool = True
) -> dict[tuple[str, int], dict[str, Metric]]:
    """Every worker's last published metrics, keyed by ``(role, index)``."""
    out: dict[tuple[str, int], dict[str, Metric]] = {}
    for key, raw in txn.get_range_startswith((*SYSTEM, "status"), snapshot=snapshot):
        try:
            out[(str(key[-2]), int(key[-1]))] = json.loads(raw)
        except Exception as exc:
            raise _bad_record(f"status {key!r}", raw, exc) from exc
    return out


# -- processor metadata ---------------------------------------------------------------


@dataclass(frozen=True)
class ProcessorInfo:
    """What a processor's state was created with.

    Attributes:
        num_mappers: Number of mappers.
        num_reducers: Number of reducers.
        fingerprint: Anything else that must not change between runs (e.g. a hash of the
            mapper and reducer class names); free-form.
    """

    num_mappers: int
    num_reducers: int
    fingerprint: str = ""


_PROCESSOR_KEY = (*SYSTEM, "processor")


def write_processor_info(txn: Transaction, info: ProcessorInfo) -> None:
    """Store the processor's metadata (overwrites)."""
    txn.set(_PROCESSOR_KEY, json.dumps(asdict(info), sort_keys=True).encode())


def read_processor_info(txn: Transaction) -> ProcessorInfo | None:
    """The stored processor metadata, ``None`` for a new processor."""
    raw = txn.get(_PROCESSOR_KEY)
    if raw is None:
        return None
    try:
        return ProcessorInfo(**json.loads(raw))
    except Exception as exc:
        raise _bad_record("processor metadata", raw, exc) from exc


def _same_classes(stored: ProcessorInfo, info: ProcessorInfo) -> bool:
    """Whether a fingerprint of earlier releases (classes with their module, such as
    ``jobs.Sum->jobs.Store``) names the classes of ``info`` (``Sum->Store``)."""
    if (stored.num_mappers, stored.num_reducers) != (info.num_mappers, info.num_reducers):
        return False
    old, new = stored.fingerprint.split("->"), info.fingerprint.split("->")
    return len(old) == len(new) == 2 and all(
        o == n or o.endswith(f".{n}") for o, n in zip(old, new, strict=True)
    )


def check_processor_info(txn: Transaction, info: ProcessorInfo) -> None:
    """Record ``info`` for a new processor, or refuse a restart that does not match it.

    Raises:
        ConfigurationError: The stored counts or fingerprint differ from ``info``.
    """
    stored = read_processor_info(txn)
    if stored is None:
        write_processor_info(txn, info)
        return
    if stored != info and not _same_classes(stored, info):
        raise ConfigurationError(
            f"this store prefix holds a processor with {stored.num_mappers} mappers, "
            f"{stored.num_reducers} reducers and fingerprint {stored.fingerprint!r}, but it "
            f"was started with {info.num_mappers} mappers, {info.num_reducers} reducers and "
            f"fingerprint {info.fingerprint!r}. Restart it with the original configuration, "
            "or use a new store prefix (or file) for the new one."
        )


__all__ = [
    "OUTPUT",
    "QUEUES",
    "ROLES",
    "SYSTEM",
    "MapperState",
    "Metric",
    "ProcessorInfo",
    "ReducerState",
    "WorkerInfo",
    "check_processor_info",
    "freshest_workers",
    "list_workers",
    "mapper_state_key",
    "read_mapper_state",
    "read_processor_info",
    "read_reducer_state",
    "read_statuses",
    "reducer_state_key",
    "register_worker",
    "remove_stale_workers",
    "unregister_worker",
    "write_mapper_state",
    "write_processor_info",
    "write_reducer_state",
    "write_worker_status",
]
