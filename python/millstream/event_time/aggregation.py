"""What an event-time aggregation computes: panes over a time column, a key, aggregates."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from millstream.exceptions import ConfigurationError

FUNCTIONS = ("count", "sum", "min", "max", "mean")
"""The built-in aggregate functions."""

Span = int | dt.timedelta
"""A length of event time: ticks of an int64 time column, or a timedelta (for a timestamp
column, converted to its unit)."""


@dataclass(frozen=True)
class Panes:
    """An aggregation per key over panes of event time, emitted once per closed pane.

    A *pane* is a stretch ``[start, start + size)`` of event time (what stream processors
    often call an event-time window; millstream's *window* is the mapper's buffer of mapped
    rows). Rows are assigned to panes by their ``time`` column: tumbling panes
    ``[k * size, (k + 1) * size)`` when ``slide`` is None, else sliding panes of ``size``
    starting every ``slide``. Per pane and key, ``aggregates`` are computed; a pane is
    emitted, once, when the watermark (the smallest over input partitions of the latest
    event time read from each) passes its end by ``lateness``. A row that arrives for a
    pane already emitted is *late*: it changes nothing emitted, is counted
    (:func:`~millstream.event_time.late_rows`, ``late_rows`` in ``millstream status`` and
    the metrics) and, with ``late_output``, sent there. When every partition's input
    ended, every pane still open is emitted.

    Args:
        time: The event-time column: int64 (ticks of your choice, e.g. epoch
            milliseconds) or a timestamp.
        key: The key column (integers, string, large_string, binary or large_binary);
            ``None``: one global key.
        size: The pane's length.
        slide: Sliding panes start every ``slide`` (which divides ``size``); None:
            tumbling panes.
        lateness: How far behind the watermark a row may be and still count.
        aggregates: Output column -> ``(input column, function)``, function one of
            ``count``, ``sum``, ``min``, ``max``, ``mean`` (``count`` may take ``None`` as
            its column: every row). Input columns must have no nulls, and be integers,
            float32, float64 or booleans (or timestamps, for ``min`` and ``max``); others
            are refused on the first batch. Output types: ``min`` and ``max`` keep the
            column's type, ``sum`` is int64 (signed integers), uint64 (unsigned integers,
            booleans) or float64 (floats), ``mean`` float64, ``count`` int64.
        output: Name of the processor output (a ``StoreQueue`` or a ``ParquetSink`` in
            ``Processor(outputs=...)``) the closed panes go to, as rows
            ``(window_start, window_end, key, *aggregates)`` (the columns keep the names
            earlier releases wrote).
        finish: A user function applied to each table of closed panes before it is
            emitted (derived columns, filters); it must return a table.
        late_output: Name of a processor output the late rows go to, as the aggregates
            they would have added: rows ``(window_start, window_end, key, *aggregates)``
            per pane and key (not through ``finish``), once, in the commit that counts
            them. None: late rows are only counted.
        idle_timeout: Seconds (or a timedelta) of a reducer's clock after which an input
            partition whose latest event time has not advanced stops holding the
            watermark; its rows for panes emitted meanwhile are late. None (the default):
            a partition holds the watermark until its input ends.
    """

    time: str
    key: str | None
    size: Span
    aggregates: Mapping[str, tuple[str | None, str]]
    output: str
    slide: Span | None = None
    lateness: Span = 0
    finish: Callable[[pa.Table], pa.Table] | None = field(default=None, compare=False)
    late_output: str | None = None
    idle_timeout: float | dt.timedelta | None = None

    def __post_init__(self) -> None:
        if not self.aggregates:
            raise ConfigurationError("Panes needs at least one aggregate")
        for name, (column, function) in self.aggregates.items():
            if function not in FUNCTIONS:
                raise ConfigurationError(
                    f"aggregate {name!r}: function must be one of {FUNCTIONS}, got {function!r}"
                )
            if column is None and function != "count":
                raise ConfigurationError(f"aggregate {name!r}: {function} needs a column")
        reserved = {"window_start", "window_end", self.key}
        clash = reserved.intersection(self.aggregates)
        if clash:
            raise ConfigurationError(f"aggregate names {sorted(map(str, clash))} are taken")
        for what, span in (("size", self.size), ("slide", self.slide), ("lateness", self.lateness)):
            if span is None:
                continue
            if not isinstance(span, int | dt.timedelta):
                raise ConfigurationError(f"{what} must be an int or a timedelta, got {span!r}")
            if what != "lateness" and _positive(span) <= 0:
                raise ConfigurationError(f"{what} must be positive, got {span!r}")
            if what == "lateness" and _positive(span) < 0:
                raise ConfigurationError(f"lateness must be >= 0, got {span!r}")
        if self.late_output is not None and self.late_output == self.output:
            raise ConfigurationError(
                f"late_output and output are both {self.output!r}: late rows go to an output "
                "of their own (their rows are not the panes'), or set late_output=None"
            )
        idle = self.idle_seconds
        if idle is not None and not idle > 0:
            raise ConfigurationError(
                f"idle_timeout must be a positive number of seconds, a timedelta or None, "
                f"got {self.idle_timeout!r}"
            )

    @property
    def idle_seconds(self) -> float | None:
        """``idle_timeout`` in seconds (None: partitions never turn idle)."""
        timeout = self.idle_timeout
        if isinstance(timeout, dt.timedelta):
            return timeout.total_seconds()
        if timeout is None:
            return None
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ConfigurationError(
                f"idle_timeout must be seconds (a number), a timedelta or None, got {timeout!r}"
            )
        return float(timeout)

    @property
    def tumbling(self) -> bool:
        """Whether panes do not overlap."""
        return self.slide is None

    def ticks(self, kind: pa.DataType) -> tuple[int, int, int]:
        """``(size, slide, lateness)`` in ticks of a time column of type ``kind``.

        Raises:
            ConfigurationError: The time column's type is not int64 or timestamp, a
                timedelta is given for an int64 column, or slide does not divide size.
        """
        size = _ticks(self.size, kind, "size")
        slide = size if self.slide is None else _ticks(self.slide, kind, "slide")
        lateness = _ticks(self.lateness, kind, "lateness")
        if size % slide:
            raise ConfigurationError(f"slide ({self.slide}) must divide size ({self.size})")
        return size, slide, lateness


def _positive(span: Span) -> float:
    return span.total_seconds() if isinstance(span, dt.timedelta) else span


_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _ticks(span: Span, kind: pa.DataType, what: str) -> int:
    if pa.types.is_timestamp(kind):
        if isinstance(span, int):
            return span
        per_second = _PER_SECOND[kind.unit]
        return int(span / dt.timedelta(microseconds=1)) * per_second // 1_000_000
    if pa.types.is_integer(kind):
        if isinstance(span, dt.timedelta):
            raise ConfigurationError(
                f"{what} is a timedelta but the time column is {kind}: give it in the "
                "column's ticks (an int), or make the column a timestamp"
            )
        return span
    raise ConfigurationError(
        f"the time column must be an integer or a timestamp column, got {kind}"
    )


CONFIG_KEY = "panes"
"""The processor's ``config`` entry holding the :class:`Panes`."""

OLD_CONFIG_KEY = "windows"
"""The entry earlier releases read (still read, with a :class:`DeprecationWarning`)."""


class UsesPanes:
    """The panes' mapper and reducers: the aggregation they compute, from the
    processor's ``config["panes"]``."""

    config: Mapping[str, Any]

    @property
    def panes(self) -> Panes:
        """The aggregation, from ``config["panes"]`` (or, deprecated, ``config["windows"]``).

        Raises:
            ConfigurationError: The entry is missing or not a ``Panes``.
        """
        panes = self.config.get(CONFIG_KEY)
        if panes is None and OLD_CONFIG_KEY in self.config:
            warnings.warn(
                "config={'windows': ...} is deprecated: name the aggregation "
                "config={'panes': ms.event_time.Panes(...)}",
                DeprecationWarning,
                stacklevel=2,
            )
            panes = self.config[OLD_CONFIG_KEY]
        if not isinstance(panes, Panes):
            raise ConfigurationError(
                "an event-time processor needs config={'panes': ms.event_time.Panes(...)}, "
                f"got {panes!r}"
            )
        return panes
