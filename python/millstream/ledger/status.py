"""One status snapshot of a processor, read in one transaction: what ``millstream status``
prints, what the local runner's progress lines and the metrics report."""

from __future__ import annotations

import time
from typing import Any

from millstream.ledger.dead_letters import dead_letter_counts
from millstream.ledger.discovery import Metric, freshest_workers, list_workers, read_statuses
from millstream.ledger.mapper import read_mapper_state
from millstream.ledger.processor_record import read_processor_info
from millstream.ledger.reducer import read_reducer_state
from millstream.state.transaction import StoreTransaction

REDUCER_ACTIVITIES = ("store", "reduce", "mapper_wait")
"""Where a reducer's time goes: its store transactions (reading its state and spills,
committing; ``reduce`` excluded), the user's ``reduce`` or ``process``, and GetRows
(waiting for the mappers' answers, sending acknowledgements). The rest is its own work
(decoding rows, outputs) and sleeping between rounds."""


def _float(status: dict[str, Metric], what: str) -> float:
    try:
        return float(status.get(what, 0) or 0)
    except ValueError:
        return 0.0


def read_status(
    txn: StoreTransaction, prefix: str, heartbeat: float = 1.0
) -> dict[str, Any] | None:
    """A processor's status as plain data (what ``status --json`` prints); None if the
    store holds no processor under ``prefix``.

    Mappers: rows read and persisted, ``lag_rows`` (rows of the input partition not yet
    committed, when the input knows its end), ``lag_seconds`` (that lag over the recent
    commit rate), recent rows/s and the window. Reducers: commits, rows, recent rows/s,
    seconds since the last commit, the committed row indices and ``time_shares``: of its
    recent time, the share in store transactions, in the user's ``reduce`` and waiting for
    the mappers' answers (:data:`REDUCER_ACTIVITIES`), and ``late_rows`` (event-time
    pane reducers: rows committed as late; None for other reducers). Both: ``dead_letters``,
    the rows set aside as dead letters (as the store counts them: each once). A worker is
    ``alive`` when its discovery entry's heartbeat is younger than ten ``heartbeat``
    periods.
    """
    info = read_processor_info(txn)
    if info is None:
        return None
    statuses = read_statuses(txn)
    live_mappers = freshest_workers(list_workers(txn, "mapper"))
    live_reducers = freshest_workers(list_workers(txn, "reducer"))
    dead = dead_letter_counts(txn)
    now = time.time()
    stale = 10 * heartbeat
    mappers = []
    for m in range(info.num_partitions):
        persisted = read_mapper_state(txn, m).input_unread_row_index
        s = statuses.get(("mapper", m), {})
        end = s.get("partition_end_row_index")
        lag = None if end is None else max(0, int(end) - persisted)
        rate = _float(s, "rows_persisted_per_second")
        lag_seconds = None if lag is None else (0.0 if lag == 0 else lag / rate if rate else None)
        mappers.append(
            {
                "index": m,
                "alive": m in live_mappers and now - live_mappers[m].heartbeat < stale,
                "rows_read": max(int(_float(s, "input_end_row_index")), persisted),
                "rows_persisted": persisted,
                "partition_end_row_index": None if end is None else int(end),
                "lag_rows": lag,
                "lag_seconds": lag_seconds,
                "rows_per_second": _float(s, "rows_read_per_second"),
                "window_rows": int(_float(s, "window_rows")),
                "window_bytes": int(_float(s, "window_bytes")),
                "memory_limit_bytes": int(_float(s, "memory_limit_bytes")),
                "dead_letters": dead.get(("map", m), 0),
                "last_error": str(s.get("last_error", "")),
            }
        )
    reducers = []
    for r in range(info.num_reducers):
        committed = read_reducer_state(txn, r, info.num_partitions).committed_row_indices
        s = statuses.get(("reducer", r), {})
        last_commit = _float(s, "last_commit_time")
        uptime = _float(s, "uptime")
        reducers.append(
            {
                "index": r,
                "alive": r in live_reducers and now - live_reducers[r].heartbeat < stale,
                "commits": int(_float(s, "commits")),
                "rows_reduced": int(_float(s, "rows_reduced")),
                "rows_per_second": _float(s, "rows_reduced_per_second"),
                "bytes_per_second": _float(s, "bytes_fetched") / uptime if uptime else 0.0,
                "seconds_since_commit": now - last_commit if last_commit else None,
                "committed_row_indices": list(committed),
                "late_rows": int(_float(s, "late_rows")) if "late_rows" in s else None,
                "dead_letters": dead.get(("reduce", r), 0),
                "time_shares": {
                    activity: _float(s, f"seconds_{activity}_per_second")
                    for activity in REDUCER_ACTIVITIES
                },
                "last_error": str(s.get("last_error", "")),
            }
        )
    return {
        "processor": prefix,
        "num_partitions": info.num_partitions,
        "num_reducers": info.num_reducers,
        "time": now,
        "mappers": mappers,
        "reducers": reducers,
        "dead_letters": sum(dead.values()),
    }
