"""A worker process's entry: what a child of the local runner runs, what it sends back
when it stops on an error, and the exit codes that tell the runner whether a restart can
cure it.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from millstream.exceptions import FATAL_ERRORS, MillstreamError, UserCodeError
from millstream.rpc.address import LOOPBACK
from millstream.runner.forkserver import IN_WORKER_ENV, die_with_parent, is_script
from millstream.runner.placement import WorkerHost
from millstream.runner.profiling import profiled

if TYPE_CHECKING:
    from millstream.processor import Processor

EXIT_USER_ERROR = 3
EXIT_CONFIG_ERROR = 4
"""Exit codes of a worker that stopped on an error a restart cannot cure (user code; any
other fatal error: configuration, input, store corruption or limits)."""

MAX_MESSAGE = 16_000
"""Characters of an error message a child sends (well below a pipe's buffer)."""


def child_main(
    path: list[str],
    environ: dict[str, str],
    payload: bytes,
    role: str,
    index: int,
    errors: Connection,
    parent: int | None,
    placement: WorkerHost | None = None,
) -> None:
    # Forked from the fork server: take this run's import path and environment before
    # unpickling the user's classes (the server's may be older).
    die_with_parent(parent)
    sys.path[:] = path
    os.environ.clear()
    os.environ.update(environ)
    os.environ[IN_WORKER_ENV] = "1"

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        processor: Processor = pickle.loads(payload)
    except Exception as exc:
        # The user's module does not import here (or its classes moved): no restart helps.
        message = (
            f"could not load the processor's classes in the worker process: "
            f"{describe_error(exc)}. Make the mapper's and reducer's module importable in a fresh "
            "process (no side effects that fail outside the launching program)"
        )
        errors.send(("ConfigurationError", message[:MAX_MESSAGE]))
        errors.close()
        sys.exit(EXIT_CONFIG_ERROR)
    try:
        address = LOOPBACK
        if placement is not None:
            placement.enter()  # before any thread or socket: they belong to the host's network
            address = placement.address
        # Imported by the fork server before it forked this process (PRELOAD): the runner
        # that imports this module does not pay for the workers.
        from millstream.workers.serve import run_worker

        profile_dir = os.environ.get("MILLSTREAM_PROFILE_DIR")
        if profile_dir:
            profiled(profile_dir, f"{role}-{index}-{os.getpid()}.prof")(
                processor, role, index, stop
            )
        else:
            run_worker(processor, role, index, stop, host=address)
    except FATAL_ERRORS as exc:
        # Each child has its own pipe: a worker killed while writing cannot wedge the
        # others (a shared queue's lock would stay held by the dead writer).
        errors.send((type(exc).__name__, str(exc)[:MAX_MESSAGE]))
        errors.close()
        sys.exit(EXIT_USER_ERROR if isinstance(exc, UserCodeError) else EXIT_CONFIG_ERROR)
    except Exception as exc:
        # A crash a restart may cure (or not: the restart strategy decides); tell the
        # runner what it was, so that a crash loop ends naming it.
        errors.send((type(exc).__name__, describe_error(exc)[:MAX_MESSAGE]))
        errors.close()
        raise


def describe_error(exc: BaseException) -> str:
    """``Type: message`` and where it was raised (the innermost frames)."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames)
    return f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")


def dump_processor(processor: Processor) -> bytes:
    """Pickle ``processor`` for worker processes.

    Classes of scripts (``__main__``, files run by ``millstream run job.py:...``) travel
    by value: a worker never imports the script, whose top level may start the job itself.
    Classes of importable modules travel by reference, as plain pickle does.
    """
    import cloudpickle

    for cls in (processor.mapper, processor.reducer, type(processor.input)):
        module = sys.modules.get(cls.__module__)
        if module is not None and is_script(cls.__module__) and cls.__module__ != "__main__":
            cloudpickle.register_pickle_by_value(module)
    data: bytes = cloudpickle.dumps(processor, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def error_class(name: str) -> type[MillstreamError]:
    """The error class a child named when it stopped (:class:`MillstreamError` if unknown)."""
    for cls in FATAL_ERRORS:
        if cls.__name__ == name:
            return cls
    return MillstreamError


__all__ = [
    "EXIT_CONFIG_ERROR",
    "EXIT_USER_ERROR",
    "MAX_MESSAGE",
    "child_main",
    "describe_error",
    "dump_processor",
    "error_class",
]
