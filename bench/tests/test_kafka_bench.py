"""bench.kafka's own instruments: the broker-alone fetch walks every partition to its end
offset (its offsets read from the batch headers), and the mappers' timeline summarizes."""

from __future__ import annotations

import time
from pathlib import Path

from bench.kafka_broker_alone import serve_all
from bench.kafka_timeline import summarize
from tests.support.kafka_broker import kafka_bootstrap_address, new_topic, produce


def test_the_broker_alone_is_fetched_to_every_partitions_end() -> None:
    with kafka_bootstrap_address() as bootstrap:
        name = new_topic(bootstrap, 2)
        for _round in range(3):  # several batches a partition
            produce(bootstrap, name, [(p, None, b"x" * 100) for p in (0, 1) for _ in range(500)])
        calls: list[int] = []

        def broker_cpu() -> float:
            calls.append(1)
            return 0.0

        served = serve_all(bootstrap, name, [1_500, 1_500], broker_cpu, fetch_bytes=4 << 10)
    # Each record's 100-byte value crossed the wire at least once, and the walk ended.
    assert served.bytes >= 2 * 1_500 * 100
    assert served.seconds > 0
    assert len(calls) == 2


def test_the_timeline_gives_first_rows_last_map_and_end(tmp_path: Path) -> None:
    started = time.time()
    path = tmp_path / "timeline.txt"
    lines = [
        (started + 0.5, started + 0.6, 100, 11),
        (started + 0.2, started + 0.3, 100, 12),
        (started + 0.7, started + 0.9, 50, 11),
    ]
    path.write_text("".join(f"{a:.6f} {b:.6f} {rows} {pid}\n" for a, b, rows, pid in lines))
    summary = summarize(path, started, started + 1.2)
    assert abs(summary["first_rows"] - 0.2) < 1e-3
    assert abs(summary["every_mapper_has_rows"] - 0.5) < 1e-3
    assert abs(summary["last_map_ended"] - 0.9) < 1e-3
    assert abs(summary["run_ended"] - 1.2) < 1e-3
