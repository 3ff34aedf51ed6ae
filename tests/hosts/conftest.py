"""The hosts tests run the integration tests' jobs (``tests.support.jobs``) on hosts of
their own (``tests.support.hosts``)."""

from __future__ import annotations

import pytest

from tests.support.hosts.cluster import require_root


@pytest.fixture
def root() -> None:
    """Skip unless this process may create network namespaces."""
    require_root()
