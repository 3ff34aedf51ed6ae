"""The names the event-time package had as ``millstream.windows`` still work, each with a
DeprecationWarning: the module, its classes, ``config={"windows": ...}`` and
``Reducer.drained_mappers``."""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

import millstream as ms
import pytest

PANES = ms.event_time.Panes(
    time="ts", key="key", size=60_000, aggregates={"n": (None, "count")}, output="o"
)


def _old_module() -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module("millstream.windows")


def test_the_old_module_imports_with_a_warning() -> None:
    sys.modules.pop("millstream.windows", None)
    with pytest.warns(DeprecationWarning, match="millstream.event_time"):
        importlib.import_module("millstream.windows")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Windows", "Panes"),
        ("WindowMapper", "PaneMapper"),
        ("WindowReducer", "PaneReducer"),
        ("PendingWindowReducer", "PendingPaneReducer"),
    ],
)
def test_old_class_names_are_the_new_classes(old: str, new: str) -> None:
    windows = _old_module()
    with pytest.warns(DeprecationWarning, match=f"millstream.event_time.{new}"):
        assert getattr(windows, old) is getattr(ms.event_time, new)


def test_unchanged_names_are_the_same_objects() -> None:
    windows = _old_module()
    with pytest.warns(DeprecationWarning, match="millstream.event_time.late_rows"):
        assert windows.late_rows is ms.event_time.late_rows
    with pytest.warns(DeprecationWarning, match="millstream.event_time.START"):
        assert windows.START == ms.event_time.START
    with pytest.raises(AttributeError):
        _ = windows.NoSuchName


def test_the_old_config_key_is_read_with_a_warning() -> None:
    spec = ms.WorkerSpec("p", "mapper", 0, "m", 1, 1)
    mapper = ms.event_time.PaneMapper(spec, {"windows": PANES})
    with pytest.warns(DeprecationWarning, match="'panes'"):
        assert mapper.panes is PANES
    assert ms.event_time.PaneMapper(spec, {"panes": PANES}).panes is PANES


def test_drained_mappers_is_drained_partitions() -> None:
    reducer = ms.event_time.PaneReducer(ms.WorkerSpec("p", "reducer", 0, "r", 2, 1), {})
    reducer.drained_mappers = frozenset({1})  # as workers set it, silently
    assert reducer.drained_partitions == frozenset({1})
    with pytest.warns(DeprecationWarning, match="drained_partitions"):
        assert reducer.drained_mappers == frozenset({1})
