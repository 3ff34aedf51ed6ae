"""Event-time windows: tumbling and sliding windowed aggregation per key, exactly once.

    windows = ms.windows.Windows(time="ts", key="word", size=60_000, lateness=5_000,
                                 aggregates={"n": (None, "count"), "total": ("value", "sum")},
                                 output="per-minute")
    processor = ms.Processor(mapper=ms.windows.WindowMapper, reducer=ms.windows.WindowReducer,
                             config={"windows": windows}, outputs=[sink], ...)

Mappers combine each batch into partial aggregates per window and key (Arrow group-bys)
and report their latest event time; reducers merge partials and emit each window once it
closes. Two reducers: :class:`WindowReducer` keeps open windows' partials in the store
with its commits (any number of open windows); :class:`PendingWindowReducer` keeps them
pending in the mappers' memory (a persistent-queue reducer) and writes only the results.
"""

from millstream.windows.mapper import WindowMapper
from millstream.windows.partials import END, START, Plan
from millstream.windows.pending import PendingWindowReducer
from millstream.windows.reducer import WindowReducer, late_rows
from millstream.windows.spec import FUNCTIONS, Windows

__all__ = [
    "END",
    "FUNCTIONS",
    "START",
    "PendingWindowReducer",
    "Plan",
    "WindowMapper",
    "WindowReducer",
    "Windows",
    "late_rows",
]
