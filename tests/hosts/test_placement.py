"""A worker placed on a host that does not exist stops the run with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from millstream.exceptions import ConfigurationError
from millstream.runner.local import LocalRunner
from millstream.runner.placement import WorkerHost

from tests.support.jobs import keyed_processor, write_keyed_input


def test_a_missing_network_namespace_is_a_configuration_error(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 2_000, partitions=2)
    processor = keyed_processor(data, tmp_path / "state.db")
    host = WorkerHost("127.0.0.1", "millstream-no-such-namespace")
    with pytest.raises(ConfigurationError, match="ip netns add millstream-no-such-namespace"):
        LocalRunner(processor, hosts={("reducer", 1): host}).run(timeout=60)
