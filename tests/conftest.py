"""Session-wide setup: the repository root is importable (examples, test job modules).

Worker processes are spawned and unpickle the user's classes by module path; spawn hands
the parent's ``sys.path`` to every child, so what is importable here is importable there.
The examples generate their input when imported: point them at a small input under a
temporary directory so importing them in tests never writes the full-size data.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import millstream  # noqa: F401  (before any grpc import: it turns gRPC's fork handlers off)
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# No per-example time limit: the tests assert behaviour, not speed, and a loaded 2-core
# machine (a first call that imports, a Rust build beside the suite) can take longer than
# hypothesis's 200 ms default for reasons that have nothing to do with the code.
settings.register_profile("millstream", deadline=None)
settings.load_profile("millstream")

os.environ.setdefault("MILLSTREAM_EXAMPLE_ROWS", "20000")
os.environ.setdefault("MILLSTREAM_EXAMPLE_DIR", tempfile.mkdtemp(prefix="millstream-examples-"))
