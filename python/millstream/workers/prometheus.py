"""Prometheus metrics of a worker, written to a ``prometheus_client`` multiprocess directory.

A runner that serves metrics (``run_local(metrics_port=...)``, ``millstream run
--metrics-port``) gives its workers a multiprocess directory in ``PROMETHEUS_MULTIPROC_DIR``
and serves everything written there on one port. Without that variable a worker does not
import ``prometheus_client`` at all.

The hot path stays untouched: counters and gauges follow the status figures the heartbeat
already gathers (once per heartbeat period), and only the reducer's commit records two
histogram observations (once per commit, never per row).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from millstream.ledger import Metric

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""The variable ``prometheus_client`` reads its multiprocess directory from."""

COMMIT_SECONDS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Store commit latency: from a local SQLite commit (a millisecond) to FoundationDB's
five-second transaction limit and beyond."""

TRANSACTION_BYTES_BUCKETS = tuple(float(1 << shift) for shift in range(10, 25, 2))
"""Bytes a reducer's commit writes: 1 KiB to 16 MiB by factors of 4 (FoundationDB refuses
transactions above 10 MB)."""

LABELS = ("role", "index", "partition")

_COUNTERS = {
    "mapper": {
        "rows_read": ("millstream_rows_read", "Input rows read by mappers (replays count again)."),
        "rows_shuffled": (
            "millstream_rows_shuffled",
            "Rows produced by map (shuffle numbering; replays count again).",
        ),
        "batches": ("millstream_batches_mapped", "Batches mapped."),
        "rows_spilled": (
            "millstream_rows_spilled",
            "Rows written to the store for reducers that fell behind (straggler spill).",
        ),
        "bytes_spilled": ("millstream_bytes_spilled", "Arrow bytes of the spilled rows."),
        "dead_letters": (
            "millstream_dead_letters",
            "Rows map or reduce raised on, set aside as dead letters (mapper replays count again).",
        ),
    },
    "reducer": {
        "split_brains": (
            "millstream_split_brains",
            "Reducer commits abandoned because the state changed under them.",
        ),
        "rows_emitted": (
            "millstream_rows_emitted",
            "Rows reducers appended to output queues in their commits.",
        ),
        "files_published": (
            "millstream_files_published",
            "Parquet files reducers published to output sinks in their commits.",
        ),
        "dead_letters": (
            "millstream_dead_letters",
            "Rows map or reduce raised on, set aside as dead letters (mapper replays count again).",
        ),
        "seconds_store": (
            "millstream_reducer_store_seconds",
            "Seconds reducers spent in store transactions (their reduce excluded).",
        ),
        "seconds_reduce": (
            "millstream_reducer_reduce_seconds",
            "Seconds reducers spent in the user's reduce (or process).",
        ),
        "seconds_mapper_wait": (
            "millstream_reducer_mapper_wait_seconds",
            "Seconds reducers spent waiting for their mappers' GetRows answers.",
        ),
    },
}
"""Status figure -> (metric name without ``_total``, help), per role."""

_GAUGES = {
    "mapper": {
        "lag_rows": (
            "millstream_lag_rows",
            "Rows of the input partition not yet committed (its end minus the persisted index).",
        ),
        "window_bytes": ("millstream_window_bytes", "Bytes of mapped rows held in the window."),
        "window_rows": ("millstream_window_rows", "Mapped rows held in the window."),
        "persisted_input_unread_row_index": (
            "millstream_persisted_input_row_index",
            "Input rows whose effects are committed and persisted.",
        ),
    },
    "reducer": {
        "late_rows": (
            "millstream_late_rows",
            "Input rows event-time pane reducers committed as late (their pane was emitted).",
        ),
    },
}


def enabled() -> bool:
    """Whether this process writes metrics (its runner serves a multiprocess directory)."""
    return bool(os.environ.get(MULTIPROC_ENV))


def _use_multiprocess_values() -> None:
    """Make ``prometheus_client`` write values into the multiprocess directory.

    It picks its value class when first imported; a worker forked from a process that
    imported it before the variable was set would keep in-memory values nobody serves.
    """
    from prometheus_client import values

    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]


class WorkerMetrics:
    """One worker's metrics; ``index`` and ``partition`` labels are the worker's index
    (a mapper's partition is its index; a reducer's is the reducer partition it owns)."""

    def __init__(self, role: str, index: int) -> None:
        _use_multiprocess_values()
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        # Values go to the multiprocess directory; the runner's collector reads them from
        # there, so this registry is only a namespace that never clashes between workers.
        registry = CollectorRegistry(auto_describe=False)
        labels = {"role": role, "index": str(index), "partition": str(index)}
        self._role = role
        self._last: dict[str, float] = {}
        self._counters = {
            figure: Counter(name, text, LABELS, registry=registry).labels(**labels)
            for figure, (name, text) in _COUNTERS[role].items()
        }
        self._gauges = {
            figure: Gauge(
                name, text, LABELS, registry=registry, multiprocess_mode="mostrecent"
            ).labels(**labels)
            for figure, (name, text) in _GAUGES[role].items()
        }
        per_commit = {
            "rows": ("millstream_rows_committed", "Rows reducers committed."),
            "commits": ("millstream_commits", "Reducer transactions committed."),
            "bytes": ("millstream_bytes_shuffled", "Arrow IPC bytes reducers committed."),
        }
        self._committed = {
            what: Counter(name, text, LABELS, registry=registry).labels(**labels)
            for what, (name, text) in (per_commit.items() if role == "reducer" else ())
        }
        self._commit_seconds = Histogram(
            "millstream_commit_seconds",
            "Latency of a reducer's store commit.",
            LABELS,
            registry=registry,
            buckets=COMMIT_SECONDS_BUCKETS,
        ).labels(**labels)
        self._transaction_bytes = Histogram(
            "millstream_transaction_bytes",
            "Bytes written by one reducer commit (user writes and reducer state).",
            LABELS,
            registry=registry,
            buckets=TRANSACTION_BYTES_BUCKETS,
        ).labels(**labels)

    def update(self, figures: Mapping[str, Metric]) -> None:
        """Follow the worker's status figures (counters grow by what they grew since)."""
        for figure, counter in self._counters.items():
            value = float(figures.get(figure, 0))
            grown = value - self._last.get(figure, 0.0)
            if grown > 0:
                counter.inc(grown)
            self._last[figure] = value
        for figure, gauge in self._gauges.items():
            if figure in figures:
                gauge.set(float(figures[figure]))

    def observe_commit(self, seconds: float, size: int, rows: int, fetched: int) -> None:
        """Record one reducer commit as it happens (a killed reducer loses none of them):
        its latency, the bytes it wrote, its rows and the Arrow bytes it fetched."""
        self._commit_seconds.observe(seconds)
        self._transaction_bytes.observe(size)
        self._committed["rows"].inc(rows)
        self._committed["commits"].inc()
        self._committed["bytes"].inc(fetched)

    def following(self, status: Callable[[], dict[str, Metric]]) -> Callable[[], dict[str, Metric]]:
        """``status`` that also updates these metrics each time the heartbeat calls it."""

        def figures() -> dict[str, Metric]:
            result = status()
            self.update(result)
            return result

        return figures


__all__ = [
    "COMMIT_SECONDS_BUCKETS",
    "MULTIPROC_ENV",
    "TRANSACTION_BYTES_BUCKETS",
    "WorkerMetrics",
    "enabled",
]
