"""One seed of the nemesis: a keyed sum on hosts of their own, cut apart while it runs,
checked exact once it drained."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from cluster import Cluster
from hosted import GatedKeyedSumMapper, Layout, hosted_runner, with_tls
from jobs import expected_sums, keyed_processor, read_output, tuning, write_keyed_input
from millstream import RestartStrategy
from nemesis import CUTS, Nemesis, plan

DRAIN_SECONDS = 60.0
"""The run must drain within this long after the nemesis's final heal: a GetRows call
stuck on a connection that a cut left half-open would hold it longer."""


@dataclass
class SeedResult:
    """What one seed did: the cuts (all landed), restarts, and the drain after the heal."""

    seed: int
    cuts: str
    restarts: int
    rows: int
    seconds_to_drain_after_heal: float

    def __str__(self) -> str:
        return (
            f"seed {self.seed}: {self.rows} rows exact, {self.restarts} restarts, drained "
            f"{self.seconds_to_drain_after_heal:.1f}s after the final heal; cuts: {self.cuts}"
        )


def run_keyed_sum(
    seed: int, directory: Path, *, rows: int = 400_000, kinds: tuple[str, ...] = CUTS
) -> SeedResult:
    """Run the keyed sum under the nemesis of ``seed``; raises AssertionError if a cut did
    not land, the run did not drain in :data:`DRAIN_SECONDS` after the final heal, or a
    sum is not exact."""
    data = write_keyed_input(directory / "in", rows, partitions=2, file_rows=50_000, seed=seed)
    gate = directory / "gate"
    gate.touch()
    tune = tuning(batch_rows=1_000, restart=RestartStrategy(max_restarts=100))
    processor = keyed_processor(
        data,
        directory / "state.db",
        tune=with_tls(tune, directory / "tls"),
        mapper=GatedKeyedSumMapper,
        config={"gate": str(gate), "map_seconds": 0.1},
    )
    layout = Layout(num_mappers=2, num_reducers=2)
    with Cluster(layout.size) as cluster:
        runner = hosted_runner(processor, layout, cluster)
        runner.start()
        try:
            with Nemesis(cluster, runner, layout, plan(seed, layout, kinds)) as nemesis:
                while not runner.poll():
                    if nemesis.healed_at is not None:
                        gate.unlink(missing_ok=True)
                        waited = time.monotonic() - nemesis.healed_at
                        assert waited < DRAIN_SECONDS, (
                            f"seed {seed}: not drained {DRAIN_SECONDS:.0f}s after the final "
                            f"heal; cuts: {nemesis.report()}"
                        )
                    time.sleep(0.05)
                nemesis.drained()
            drained = time.monotonic() - (nemesis.healed_at or time.monotonic())
            summary = runner.finish()
        except BaseException:
            runner.stop()
            raise
    nemesis.check()
    assert read_output(processor, "sum") == expected_sums(data), f"seed {seed}: sums differ"
    assert summary.rows_read == rows
    return SeedResult(seed, nemesis.report(), summary.restarts, rows, drained)
