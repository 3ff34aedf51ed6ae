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

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("MILLSTREAM_EXAMPLE_ROWS", "20000")
os.environ.setdefault("MILLSTREAM_EXAMPLE_DIR", tempfile.mkdtemp(prefix="millstream-examples-"))
