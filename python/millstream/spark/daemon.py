"""PySpark's daemon with millstream's modules imported: worker tasks start without importing.

PySpark starts one daemon per executor (and per Python environment) and forks a Python
worker from it for each task. Each worker of a millstream job then imports millstream's
workers, gRPC and pyarrow when it unpickles its task: about a second of CPU per worker,
all at the same time at the start of a run. Run as the daemon instead
(``spark.python.daemon.module=millstream.spark.daemon``), this module imports them once,
before the daemon forks, and every worker inherits them (the fork server of the local
runner does the same, :mod:`millstream.runner.forkserver`). The user's modules named in
:data:`~millstream.runner.forkserver.PRELOAD_ENV` of the daemon's environment
(:func:`millstream.spark.run` sets it for the job's Python workers) are imported too.

The daemon imports what the local runner's fork server imports before it forks (pyarrow's
allocator thread included) and opens no gRPC channel and no store. Jobs of the
application that are not millstream's run as with PySpark's daemon, in workers that have
millstream imported.
"""

from __future__ import annotations

import contextlib
import importlib
import os

from millstream.runner.forkserver import HEAVY_MODULES, PRELOAD_ENV

PRELOAD = ("pyspark.worker", "millstream.spark.launch", "millstream.workers.serve", *HEAVY_MODULES)
"""Modules the daemon imports before it forks the first worker."""


def preload() -> None:
    """Import :data:`PRELOAD` and the user's modules of :data:`PRELOAD_ENV`.

    A user's module that fails to import is skipped: the worker that needs it imports it
    again when it unpickles its task and fails there, naming the error.
    """
    for name in PRELOAD:
        importlib.import_module(name)
    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        with contextlib.suppress(Exception, SystemExit):
            importlib.import_module(name)


def main() -> None:
    """Import what the workers need, then serve as PySpark's daemon."""
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
