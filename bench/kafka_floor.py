"""How fast records can leave a Kafka broker into Arrow, and what that allows the Kafka
source against the Parquet source on the README's keyed sum (issue 45's 80 %).

The same rows and topic as :mod:`bench.kafka` (2 partitions, one 80-byte record a row, on a
``noida-db`` broker started here). Measured, rounds alternating:

* **the jobs**: the keyed sum read from Parquet files and from the topic, with the shipped
  ``KafkaTopic`` reader and with **native fetch**, a reader that runs the ``kafka-floor``
  program of ``bench/kafka_floor/`` (Kafka's Fetch request with ``read_committed``, records
  walked into Arrow columns in Rust, the batches piped to the mapper as an Arrow IPC
  stream): wall seconds, and the CPU seconds of the job's processes and of the broker.
* **partition 0 read alone** by each reader (1 M records): the reader's CPU and the
  broker's, per record. Native: ``fetch``, and with ``--rdkafka`` librdkafka through the
  ``rdkafka`` crate, one poll per record and batch consume (librdkafka is compiled from its
  bundled sources: the build takes minutes, and its time is printed). Python: the shipped
  reader, and a bare confluent-kafka consumer that only counts (``bench.kafka``).

Then the **bound**: on a machine whose cores are all busy (2 cores here), a job's rows/s
goes as the inverse of its CPU per row, so with ``P`` the Parquet job's CPU per row, ``r``
the Parquet reader's, and ``c`` and ``b`` a Kafka reader's and the broker's per record,
the Kafka source's rows/s over the Parquet source's is at most about ``P / (P - r + c +
b)`` (the job's other work unchanged). The measured ratios of the jobs say how close that
comes.

Run::

    .venv/bin/python -m bench.kafka_floor --rows 2000000 --rounds 3 [--rdkafka]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa

from bench import kafka as bk
from bench.keyed_sum_stores import expected_sums
from examples import keyed_sum

PROJECT = Path(__file__).with_name("kafka_floor")
"""The Rust program's package."""


def build(target_dir: Path, rdkafka: bool) -> tuple[Path, float]:
    """``cargo build --release`` of ``kafka-floor``; its path and the build's seconds."""
    command = ["cargo", "build", "--release", "--manifest-path", str(PROJECT / "Cargo.toml")]
    if rdkafka:
        command += ["--features", "rdkafka"]
    started = time.monotonic()
    subprocess.run(command, check=True, env={**os.environ, "CARGO_TARGET_DIR": str(target_dir)})
    return target_dir / "release" / "kafka-floor", time.monotonic() - started


# -- the native reader in the job -----------------------------------------------------------


@dataclass(frozen=True)
class NativeFetchTopic:
    """A bounded topic read by ``kafka-floor fetch --ipc``, one process per partition read
    (an input for this benchmark only: no retention check, no group offsets)."""

    program: str
    bootstrap: str
    topic: str
    end_offsets: tuple[int, ...]

    @property
    def num_partitions(self) -> int:
        """The topic's partitions."""
        return len(self.end_offsets)

    def reader(self, partition: int) -> NativeFetchReader:
        """The reader of one partition."""
        return NativeFetchReader(self, partition)


@dataclass
class NativeFetchReader:
    """Hands out the program's batches; the continuation token is the next offset."""

    source: NativeFetchTopic
    partition: int
    _process: subprocess.Popen[bytes] | None = None
    _stream: Any = None
    _pending: pa.RecordBatch | None = None
    _next: int = -1
    _done: bool = False

    def _start(self, offset: int) -> None:
        self.close()
        end = self.source.end_offsets[self.partition]
        command = [self.source.program, "fetch", self.source.bootstrap, self.source.topic]
        command += [str(self.partition), str(offset), str(end), "--ipc"]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._stream = pa.ipc.open_stream(self._process.stdout)
        self._pending, self._next, self._done = None, offset, offset >= end

    def read(self, begin: int, end_hint: int, token: bytes) -> ms.inputs.ReadResult:
        """Up to ``end_hint - begin`` records from the token's offset on."""
        offset = int.from_bytes(token, "little", signed=True) if token else 0
        if self._process is None or offset != self._next:
            self._start(offset)
        if self._pending is None and not self._done:
            try:
                self._pending = self._stream.read_next_batch()
            except StopIteration:
                self._done = True
        batch, self._pending = self._pending, None
        if batch is not None and batch.num_rows > end_hint - begin:
            batch, self._pending = batch.slice(0, end_hint - begin), batch.slice(end_hint - begin)
        if batch is not None:
            self._next = int(batch.column("offset")[-1].as_py()) + 1
        if self._done:
            self._next = self.source.end_offsets[self.partition]
        ended = self._done and self._pending is None
        return ms.inputs.ReadResult(batch, self._next.to_bytes(8, "little", signed=True), ended)

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        """Nothing to trim."""

    def close(self) -> None:
        """Stop the program."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


# -- partition 0 alone -------------------------------------------------------------------------


def native_alone(
    program: Path, reader: str, bootstrap: str, topic: str, end: int, broker: int
) -> dict[str, float]:
    """One native reader of partition 0 alone: its figures and the broker's CPU seconds."""
    before = bk.cpu_seconds(broker)
    out = subprocess.run(
        [str(program), reader, bootstrap, topic, "0", "0", str(end)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, float] = json.loads(out)
    return {**figures, "broker_cpu_seconds": bk.cpu_seconds(broker) - before}


def per_row(figures: list[dict[str, float]], name: str) -> float:
    """Median of ``name`` per row, in µs."""
    return statistics.median(f[name] / f["rows"] * 1e6 for f in figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rdkafka", action="store_true", help="also librdkafka (minutes to build)")
    parser.add_argument("--work", type=Path, default=None, help="working directory (temporary)")
    parser.add_argument("--target-dir", type=Path, default=None, help="cargo's target directory")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="millstream-bench-kafka-floor-"))
    work.mkdir(parents=True, exist_ok=True)
    program, build_seconds = build(args.target_dir or work / "target", args.rdkafka)
    print(f"kafka-floor built in {build_seconds:.0f} s", file=sys.stderr)
    natives = ["fetch"] + (["rdkafka", "rdkafka-batch"] if args.rdkafka else [])
    jobs: dict[str, list[dict[str, Any]]] = {"parquet": [], "kafka": [], "native fetch": []}
    alone: dict[str, list[dict[str, float]]] = {name: [] for name in natives}
    try:
        data = keyed_sum.generate(work, args.rows)
        expected = expected_sums(data)
        with bk.noida_broker(work) as (bootstrap, broker):
            topic = "keyed-sum"
            bk.fill_topic(bootstrap, topic, data, keyed_sum.PARTITIONS)
            ends = ms.inputs.KafkaTopic(bootstrap, topic, bounded=True).end_offsets
            assert ends is not None
            # Workers import the input by its module, even when this one runs as a script.
            from bench.kafka_floor import NativeFetchTopic as native

            makers: dict[str, Callable[[], Any]] = {
                "parquet": lambda: ms.inputs.ParquetLog(str(data), columns=("key", "value")),
                "kafka": lambda: ms.inputs.KafkaTopic(bootstrap, topic, bounded=True),
                "native fetch": lambda: native(str(program), bootstrap, topic, ends),
            }
            for source, make in makers.items():  # warm-up, not counted
                bk.run_job(source, make, work, broker, expected)
            for round_ in range(args.rounds):
                for source, make in makers.items():
                    jobs[source].append(bk.run_job(source, make, work, broker, expected))
                    print(f"round {round_} {source}: {jobs[source][-1]}", file=sys.stderr)
                for name in natives:
                    alone[name].append(
                        native_alone(program, name, bootstrap, topic, ends[0], broker)
                    )
            python_alone = bk.readers_alone(data, bootstrap, broker, topic)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report(args.rows, jobs, alone, python_alone)
    if args.json is not None:
        figures = {"rows": args.rows, "jobs": jobs, "alone": alone, "python_alone": python_alone}
        args.json.write_text(json.dumps(figures | {"build_seconds": build_seconds}, indent=2))


def report(
    rows: int,
    jobs: dict[str, list[dict[str, Any]]],
    alone: dict[str, list[dict[str, float]]],
    python_alone: dict[str, dict[str, float]],
) -> None:
    """Print the tables."""
    print(f"\n{rows:,} rows; medians of the rounds\n")
    print(
        "| job's source | wall s | rows/s | over parquet, per round | job CPU µs/row "
        "| broker CPU µs/row |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for source, runs in jobs.items():
        wall = statistics.median(r["wall"] for r in runs)
        ratios = [p["wall"] / r["wall"] for p, r in zip(jobs["parquet"], runs, strict=True)]
        job_cpu = statistics.median(r["job_cpu_seconds"] for r in runs) / rows * 1e6
        broker_cpu = statistics.median(r["broker_cpu_seconds"] for r in runs) / rows * 1e6
        print(
            f"| {source} | {wall:.2f} | {rows / wall:,.0f} | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | {job_cpu:.2f} | {broker_cpu:.2f} |"
        )
    job = statistics.median(r["job_cpu_seconds"] for r in jobs["parquet"]) / rows * 1e6
    parquet_read = (
        python_alone["parquet"]["reader_cpu_seconds"] / python_alone["parquet"]["rows"] * 1e6
    )
    readers = {
        name: (
            per_row(figures, "cpu_seconds"),
            per_row(figures, "broker_cpu_seconds"),
            per_row(figures, "wall_seconds"),
        )
        for name, figures in alone.items()
    }
    for name, f in python_alone.items():
        if name != "parquet":
            n = f["rows"]
            readers[name] = (
                f["reader_cpu_seconds"] / n * 1e6,
                f["broker_cpu_seconds"] / n * 1e6,
                f["read_seconds"] / n * 1e6,
            )
    print(f"\nPartition 0 read alone; the bound P / (P - r + c + b) with P = {job:.2f} µs (the")
    print(f"Parquet job's CPU per row) and r = {parquet_read:.2f} µs (the Parquet reader's)\n")
    print("| reader | read rows/s | reader CPU µs/record (c) | broker CPU µs/record (b) | bound |")
    print("| --- | --- | --- | --- | --- |")
    for name, (client, broker, wall) in readers.items():
        bound = job / (job - parquet_read + client + broker)
        print(f"| {name} | {1e6 / wall:,.0f} | {client:.2f} | {broker:.2f} | {bound:.2f} |")
    free = min(b for _, b, _ in readers.values())
    print(
        f"\nA reader that cost nothing, the broker alone: {job / (job - parquet_read + free):.2f}"
    )


if __name__ == "__main__":
    main()
