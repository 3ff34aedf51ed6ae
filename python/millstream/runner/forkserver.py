"""Where worker processes come from: a fork server that imported the heavy modules once.

Only the standard library is imported here, so that a runner can start the server before
it imports millstream, pyarrow and the user's modules itself: the server's imports (most of
a cold start) then overlap the runner's instead of following them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing import forkserver
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from millstream.processor import Processor

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
"""Large GetRows payloads are allocated and freed in bulk; these keep glibc from handing that
memory back to the kernel after every call (measured: 8x slower get_rows with the defaults)."""

PRELOAD = ["millstream.runner.local", "pyarrow.parquet", "pyarrow.compute", "pyarrow.acero"]
"""Modules the fork server imports once, so that workers start in milliseconds instead of
each importing them (about a second of CPU per worker)."""

WorkerContext = mp.context.ForkServerContext | mp.context.SpawnContext


def worker_context() -> WorkerContext:
    """Where worker processes come from: a fork server that has imported :data:`PRELOAD`.

    The server is a fresh process (started the spawn way) that only imports modules: it
    holds no gRPC channel, store connection or thread, so forking it is safe. Falls back to
    spawn where fork servers do not exist.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    return mp.get_context("forkserver")


def start_fork_server(processor: Processor | None = None) -> None:
    """Start the fork server now, so that it imports while this process does other work.

    Call it first thing, before importing millstream's other modules: this module needs
    only the standard library. With ``processor``, the server also imports the user's
    modules (if it is not running yet). The malloc settings of :data:`MALLOC_ENV` are put
    in the environment first: the server's allocator reads them once, at its start, and the
    workers inherit it.
    """
    os.environ.update({k: v for k, v in MALLOC_ENV.items() if k not in os.environ})
    if "forkserver" not in mp.get_all_start_methods():
        return
    modules: set[str] = set()
    if processor is not None:
        modules = {processor.mapper.__module__, processor.reducer.__module__}
        modules.discard("__main__")
    mp.set_forkserver_preload([*PRELOAD, *sorted(modules)])
    forkserver.ensure_running()
