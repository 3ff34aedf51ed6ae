"""Event-time windows: tumbling and sliding windowed aggregation per key, exactly once.

    windows = ms.windows.Windows(time="ts", key="word", size=60_000, lateness=5_000,
                                 aggregates={"n": (None, "count"), "total": ("value", "sum")},
                                 output="per-minute")
    processor = ms.Processor(mapper=ms.windows.WindowMapper, reducer=ms.windows.WindowReducer,
                             config={"windows": windows}, outputs=[sink], ...)

Mappers combine each batch into partial aggregates per window and key (Arrow group-bys)
and report their latest event time; reducers merge partials, keep open windows' partials
in the store with their commits, and emit each window once it closes.
"""

from millstream.windows.mapper import WindowMapper
from millstream.windows.partials import END, START, Plan
from millstream.windows.reducer import WindowReducer, late_rows
from millstream.windows.spec import FUNCTIONS, Windows

__all__ = [
    "END",
    "FUNCTIONS",
    "START",
    "Plan",
    "WindowMapper",
    "WindowReducer",
    "Windows",
    "late_rows",
]
