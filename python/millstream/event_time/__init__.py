"""Event-time panes: tumbling and sliding aggregation per key over event time, exactly once.

    panes = ms.event_time.Panes(time="ts", key="word", size=60_000, lateness=5_000,
                                aggregates={"n": (None, "count"), "total": ("value", "sum")},
                                output="per-minute")
    processor = ms.Processor(mapper=ms.event_time.PaneMapper,
                             reducer=ms.event_time.PendingPaneReducer,
                             config={"panes": panes}, outputs=[sink], ...)

A *pane* is a stretch of event time, ``[start, start + size)`` (what stream processors
often call an event-time window; in millstream a *window* is a mapper's buffer of mapped
rows). Mappers combine each batch into partial aggregates per pane and key (Arrow
group-bys) and report the latest event time of their input partition; reducers merge
partials and emit each pane once it closes. Two reducers: :class:`PaneReducer` keeps open
panes' partials in the store with its commits (any number of open panes);
:class:`PendingPaneReducer` keeps them pending in the mappers' memory (a persistent-queue
reducer) and writes only the results.
"""

from millstream.event_time.aggregation import FUNCTIONS, Panes
from millstream.event_time.combiner import PaneMapper
from millstream.event_time.late import late_rows
from millstream.event_time.partials import END, START, Plan
from millstream.event_time.pending_reducer import PendingPaneReducer
from millstream.event_time.stored_reducer import PaneReducer

__all__ = [
    "END",
    "FUNCTIONS",
    "START",
    "PaneMapper",
    "PaneReducer",
    "Panes",
    "PendingPaneReducer",
    "Plan",
    "late_rows",
]
