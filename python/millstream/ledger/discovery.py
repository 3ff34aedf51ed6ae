"""Discovery (thesis 4.5): live workers' entries and the metrics they publish."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field

from millstream.ledger.subspaces import SYSTEM, bad_record, check_role
from millstream.state.keys import pack, unpack
from millstream.state.transaction import StoreTransaction

Metric = float | int | str
"""One published figure of a worker's status."""


@dataclass(frozen=True)
class WorkerInfo:
    """One discovery entry (thesis 4.5).

    Which of several entries of one index is current never depends on clocks agreeing:
    ``registration`` orders instances by when they registered (a counter incremented in
    the registering transaction), and ``beats`` advances with every heartbeat, so that an
    observer can tell a live entry from a dead one on its own clock
    (:class:`millstream.workers.discovery_view.DiscoveryView`).

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
        raise bad_record(f"discovery entry {key!r}", raw, exc) from exc


def register_worker(
    txn: StoreTransaction,
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
    check_role(role)
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


def unregister_worker(txn: StoreTransaction, role: str, index: int, guid: str) -> None:
    """Remove a discovery entry (a worker leaving cleanly)."""
    check_role(role)
    txn.clear(_worker_key(role, index, guid))


def list_workers(txn: StoreTransaction, role: str, *, snapshot: bool = True) -> list[WorkerInfo]:
    """Every discovery entry of ``role``, by index then GUID.

    Several entries may share an index (a dead instance and its replacement, thesis 4.5);
    :func:`freshest_workers` picks one per index. Read as a snapshot by default so that
    heartbeats never make the reading transaction conflict.
    """
    check_role(role)
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


def remove_stale_workers(txn: StoreTransaction, stale: list[WorkerInfo]) -> int:
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
    txn: StoreTransaction, role: str, index: int, metrics: dict[str, Metric]
) -> None:
    """Publish a worker's metrics (lag, window size, throughput, ...) for the CLI."""
    check_role(role)
    for name, value in metrics.items():
        if not isinstance(value, float | int | str):
            raise TypeError(f"metric {name!r} must be a float, int or str; got {value!r}")
    txn.set((*SYSTEM, "status", role, index), json.dumps(metrics, sort_keys=True).encode())


def read_statuses(
    txn: StoreTransaction, *, snapshot: bool = True
) -> dict[tuple[str, int], dict[str, Metric]]:
    """Every worker's last published metrics, keyed by ``(role, index)``."""
    out: dict[tuple[str, int], dict[str, Metric]] = {}
    for key, raw in txn.get_range_startswith((*SYSTEM, "status"), snapshot=snapshot):
        try:
            out[(str(key[-2]), int(key[-1]))] = json.loads(raw)
        except Exception as exc:
            raise bad_record(f"status {key!r}", raw, exc) from exc
    return out
