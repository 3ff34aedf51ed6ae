"""Profiling a local run's workers: ``MILLSTREAM_PROFILE_DIR`` runs each under cProfile."""

from __future__ import annotations

import cProfile
import pstats
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


def profiled(directory: str, name: str) -> Callable[..., None]:
    """``run_worker`` under cProfile in every thread, merged stats in ``directory/name``.

    Set ``MILLSTREAM_PROFILE_DIR`` to profile every worker of a local run.
    """

    def run(*args: Any) -> None:
        from millstream.workers.serve import run_worker  # preloaded, as in runner.child

        profiles = [cProfile.Profile()]

        def in_new_thread(*_: Any) -> None:
            sys.setprofile(None)
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()

        threading.setprofile(in_new_thread)
        try:
            profiles[0].runcall(run_worker, *args)
        finally:
            threading.setprofile(None)
            stats = pstats.Stats(profiles[0])
            for profile in profiles[1:]:
                stats.add(profile)
            Path(directory).mkdir(parents=True, exist_ok=True)
            stats.dump_stats(str(Path(directory) / name))

    return run


__all__ = ["profiled"]
