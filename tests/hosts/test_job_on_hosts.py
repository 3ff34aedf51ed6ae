"""A keyed sum whose mappers and reducers each run on a host of their own, over mutual TLS."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.hosts.cluster import Cluster
from tests.support.hosts.hosted import (
    GatedKeyedSumMapper,
    Layout,
    advertised,
    hosted_runner,
    with_tls,
)
from tests.support.jobs import (
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)

pytestmark = pytest.mark.usefixtures("root")


def test_keyed_sum_across_hosts_is_exact_and_mappers_advertise_their_host(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 40_000, partitions=2)
    tune = with_tls(tuning(batch_rows=2_000), tmp_path / "tls")
    # The mappers map slowly until both were seen advertising: a mapper's discovery entry
    # leaves with it, and an ungated mapper can start and drain between two looks.
    gate = tmp_path / "gate"
    gate.touch()
    processor = keyed_processor(
        data,
        tmp_path / "state.db",
        tune=tune,
        mapper=GatedKeyedSumMapper,
        config={"gate": str(gate), "map_seconds": 0.05},
    )
    layout = Layout(num_mappers=2, num_reducers=2)
    seen: dict[int, str] = {}
    with Cluster(layout.size) as cluster:
        runner = hosted_runner(processor, layout, cluster)
        runner.start()
        try:
            while not runner.poll():
                seen.update(advertised(processor))
                if len(seen) == layout.num_mappers and gate.exists():
                    gate.unlink()
                time.sleep(0.1)
        finally:
            runner.stop()
        summary = runner.finish()
        hosts = {m: f"{cluster.hosts[m].address}" for m in layout.mapper_hosts()}
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == 40_000
    assert summary.restarts == 0
    assert {m: a.rsplit(":", 1)[0] for m, a in seen.items()} == hosts
