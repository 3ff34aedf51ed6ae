"""Where worker processes come from: a fork server that imported the heavy modules once.

Only the standard library (and :mod:`millstream.allocator`, which imports nothing) is
imported here, so that a runner can start the server before it imports millstream's heavy
modules, pyarrow and the user's modules itself: the server's imports (most of
a cold start) then overlap the runner's instead of following them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing as mp
import os
import signal
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import forkserver
from typing import TYPE_CHECKING

from millstream.allocator import MALLOC_ENV

if TYPE_CHECKING:
    from millstream.processor import Processor

HEAVY_MODULES = ("pyarrow.parquet", "pyarrow.compute", "pyarrow.acero")
"""The heavy modules every worker uses beyond millstream's own (pyarrow.acero imports
pandas)."""

PRELOAD = ["millstream.runner.local", "millstream.workers.serve", *HEAVY_MODULES]
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
    modules (if it is not running yet). The malloc settings of
    :data:`~millstream.allocator.MALLOC_ENV` are put
    in the environment first: the server's allocator reads them once, at its start, and the
    workers inherit it.
    """
    os.environ.update({k: v for k, v in MALLOC_ENV.items() if k not in os.environ})
    if "forkserver" not in mp.get_all_start_methods():
        return
    os.environ[PRELOAD_ENV] = user_modules(processor) if processor is not None else ""
    try:
        mp.set_forkserver_preload([*PRELOAD, "millstream.runner.user_modules"])
        forkserver.ensure_running()
    finally:
        del os.environ[PRELOAD_ENV]


def user_modules(processor: Processor) -> str:
    """The modules of ``processor``'s mapper and reducer that a worker can import (not
    scripts), comma-separated: the value of :data:`PRELOAD_ENV`."""
    modules = {processor.mapper.__module__, processor.reducer.__module__}
    return ",".join(sorted(name for name in modules if not is_script(name)))


PRELOAD_ENV = "MILLSTREAM_PRELOAD_MODULES"
"""Where the fork server finds the user's modules (read by ``millstream.runner.user_modules``)."""


IN_WORKER_ENV = "MILLSTREAM_IN_WORKER"
"""Set in the fork server and in every worker process: a run started there (a module
that runs its job when imported) is refused instead of nesting a run in a worker."""


_SCRIPTS: set[str] = set()


def register_script(name: str) -> None:
    """Mark module ``name`` as a script: workers get its classes by value, never import it.

    A script's top level may run the job itself (no ``if __name__ == "__main__":`` guard);
    importing it in a worker would start the job again from inside the worker.
    """
    _SCRIPTS.add(name)


def is_script(name: str) -> bool:
    """Whether classes of module ``name`` travel by value (a script, or ``__main__``)."""
    return name in ("__main__", "__mp_main__") or name in _SCRIPTS


def fork_server_pid() -> int | None:
    """The process id of the fork server this process started, if it is running."""
    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start processes without multiprocessing re-running the main script in them.

    multiprocessing re-imports the parent's ``__main__`` file in every child (as
    ``__mp_main__``) so that classes defined there unpickle; a script without a main guard
    then starts its whole job again inside each worker. millstream sends such classes by
    value instead, so the child needs no main module: while this is active, the parent's
    ``__main__`` is replaced by an empty module that names no file to re-run.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


_PR_SET_PDEATHSIG = 1


def running_fork_server() -> int | None:
    """The process id of the fork server new workers will come from, starting a new one
    if it died; None where workers are spawned instead."""
    if "forkserver" not in mp.get_all_start_methods():
        return None
    forkserver.ensure_running()
    return fork_server_pid()


def die_with_parent(parent: int | None) -> None:
    """Have the kernel kill this process when its parent, the fork server whose process id
    is ``parent``, dies (Linux).

    A worker whose fork server was killed would otherwise live on unseen: the runner can
    no longer wait for it, takes it for dead and starts another instance. The fork server
    may die before this runs (between its fork and the child's first steps): a worker whose
    parent is no longer ``parent`` ends itself at once. ``parent`` None: the current parent.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if parent is None else parent
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
