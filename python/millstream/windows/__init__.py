"""Deprecated: the event-time aggregation moved to :mod:`millstream.event_time`.

``millstream.windows`` and its names still work, with a :class:`DeprecationWarning`:
``Windows`` is now ``Panes``, ``WindowMapper`` ``PaneMapper``, ``WindowReducer``
``PaneReducer`` and ``PendingWindowReducer`` ``PendingPaneReducer`` ("window" names the
mapper's buffer of mapped rows; a stretch of event time is a *pane*).
"""

from __future__ import annotations

import warnings
from typing import Any

from millstream import event_time

_RENAMED = {
    "Windows": "Panes",
    "WindowMapper": "PaneMapper",
    "WindowReducer": "PaneReducer",
    "PendingWindowReducer": "PendingPaneReducer",
}

warnings.warn(
    "millstream.windows is deprecated: use millstream.event_time (Windows is now Panes, "
    "WindowMapper PaneMapper, WindowReducer PaneReducer, PendingWindowReducer "
    "PendingPaneReducer, config={'panes': ...})",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    new = _RENAMED.get(name, name)
    if new not in event_time.__all__:
        raise AttributeError(f"module 'millstream.windows' has no attribute {name!r}")
    warnings.warn(
        f"millstream.windows.{name} is deprecated: use millstream.event_time.{new}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(event_time, new)


__all__ = [*_RENAMED, "END", "FUNCTIONS", "START", "Plan", "late_rows"]
