"""Runners: where the workers' processes come from.

``millstream.runner.forkserver`` needs only the standard library; the local runner is
imported on first use of its names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from millstream.runner.local import LocalRunner, RunStopped, RunSummary


def __getattr__(name: str) -> Any:
    if name in ("LocalRunner", "RunStopped", "RunSummary"):
        return getattr(importlib.import_module("millstream.runner.local"), name)
    raise AttributeError(f"module 'millstream.runner' has no attribute {name!r}")


__all__ = ["LocalRunner", "RunStopped", "RunSummary"]
