"""Imported by the fork server: the user's modules, so that workers start without importing.

The fork server imports the modules named in
:data:`~millstream.runner.forkserver.PRELOAD_ENV` (comma-separated) once. One that
fails to import is skipped here: the worker that needs it imports it again when it loads the
processor, fails, and the run stops naming the error (a fork server that died on it would
only show as workers that cannot start).
"""

from __future__ import annotations

import contextlib
import importlib
import os

from millstream.runner.forkserver import IN_WORKER_ENV, PRELOAD_ENV

os.environ[IN_WORKER_ENV] = "1"
for _name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
    with contextlib.suppress(Exception, SystemExit):
        importlib.import_module(_name)
