"""Bytes written into directories of write-once files, by polling their listings.

Spark's checkpoint (offset and commit logs, state-store delta and snapshot files) and its
shuffle files are written once, under their final name or renamed into it, and never
rewritten. The sum over every file ever seen of the largest size seen is then the number of
bytes written there, even if a file is deleted later (retention, shutdown clean-up), as long
as it lived through one poll. Temporary files (``*.tmp*``) are skipped, since they are
renamed into files we count. Not suited to files rewritten in place (SQLite databases):
measure their writer process with :mod:`bench.io_meter` instead.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path


class DirectoryMeter:
    """Polls named directory trees in a thread.

    Args:
        dirs: Name to directory; the directories need not exist yet.
        interval: Seconds between polls.
    """

    def __init__(self, dirs: Mapping[str, Path], interval: float = 0.5) -> None:
        self._dirs = dict(dirs)
        self._interval = interval
        self._sizes: dict[str, dict[str, int]] = {name: {} for name in self._dirs}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dir-meter", daemon=True)

    def __enter__(self) -> DirectoryMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> dict[str, int]:
        """Poll once more, stop, and return :meth:`bytes_seen`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.poll()
        return self.bytes_seen()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.poll()

    def poll(self) -> None:
        """List every directory once."""
        for name, root in self._dirs.items():
            seen = self._sizes[name]
            for dirpath, _, filenames in os.walk(root):
                for filename in filenames:
                    if ".tmp" in filename:
                        continue
                    path = os.path.join(dirpath, filename)
                    try:
                        size = os.stat(path).st_size
                    except OSError:
                        continue
                    with self._lock:
                        if size > seen.get(path, -1):
                            seen[path] = size

    def bytes_seen(self, prefix: str = "") -> dict[str, int]:
        """Bytes per directory name; with ``prefix``, only files whose relative path
        starts with it (e.g. ``"state"`` inside a checkpoint)."""
        with self._lock:
            out = {}
            for name, seen in self._sizes.items():
                root = str(self._dirs[name])
                out[name] = sum(
                    size
                    for path, size in seen.items()
                    if os.path.relpath(path, root).startswith(prefix)
                )
            return out

    def files_seen(self, name: str) -> dict[str, int]:
        """Largest size seen per file path of one directory."""
        with self._lock:
            return dict(self._sizes[name])


def tree_size(root: Path) -> int:
    """Current size of the files under ``root``."""
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, filename)).st_size
    return total
