"""Parameters for the ``state_url`` fixture (``tests/integration/conftest.py``): which store
a test runs on.

``@pytest.mark.parametrize("state_url", ON_BOTH, indirect=True)`` runs a test on SQLite and
on the session's FoundationDB cluster; :data:`ON_FDB` alone adds one FoundationDB case.
"""

from __future__ import annotations

import pytest

ON_SQLITE = pytest.param("sqlite", id="sqlite")
ON_FDB = pytest.param("fdb", id="fdb", marks=pytest.mark.fdb)
ON_BOTH = [ON_SQLITE, ON_FDB]
