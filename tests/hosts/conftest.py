"""The hosts tests run the integration tests' jobs (``jobs``, ``tls_files``) on hosts of
their own; worker processes get this ``sys.path`` and import them by the same names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cluster import require_root

INTEGRATION = str(Path(__file__).resolve().parent.parent / "integration")
if INTEGRATION not in sys.path:
    sys.path.insert(0, INTEGRATION)


@pytest.fixture
def root() -> None:
    """Skip unless this process may create network namespaces."""
    require_root()
