"""The local runner: every worker a process on this machine (Spark's is
:mod:`millstream.spark`).

``millstream.runner.forkserver`` needs only the standard library; the local runner is
imported on first use of its names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from millstream.runner.local import LocalRunner, run_local
    from millstream.runner.pipeline import run_local_pipeline
    from millstream.runner.signals import RunStopped

_WHERE = {
    "LocalRunner": "millstream.runner.local",
    "RunStopped": "millstream.runner.signals",
    "run_local": "millstream.runner.local",
    "run_local_pipeline": "millstream.runner.pipeline",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'millstream.runner' has no attribute {name!r}")


__all__ = ["LocalRunner", "RunStopped", "run_local", "run_local_pipeline"]
