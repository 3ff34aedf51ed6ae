"""The keyed sum read from a Kafka topic against the same rows read from Parquet files.

The natural job, as the README teaches it: a mapper that sums ``value`` per ``key`` within
each batch before the shuffle (``examples.keyed_sum``), reducers that fold the partial sums
into SQLite, default :class:`~millstream.Tuning`, run by ``ms.run_local`` until drained.
The same rows (``examples.keyed_sum.generate``: int64 key over 100,000 keys, int64 value,
64-byte payload, 2 partitions) are read two ways:

* **Parquet**: ``ms.inputs.ParquetLog(..., columns=("key", "value"))`` as the example does.
* **Kafka**: a topic of 2 partitions on a ``noida-db`` broker started here; partition ``p``
  holds the rows of Parquet partition ``p`` in order, one record per row, the record key the
  8-byte little-endian key, the value 80 bytes (key and value as little-endian int64, then
  the payload): a fixed-width binary encoding, read with ``ms.inputs.KafkaTopic(...,
  bounded=True)`` and the default ``RawBytes`` decoder. Its mapper takes key and value out
  of the value column's buffer with numpy and pre-aggregates as the Parquet one does.

Runs alternate (Parquet, Kafka, Parquet, Kafka, ...) so both see the same machine load;
the figures are medians over the pairs, and the ratio that counts is Kafka over Parquet
measured side by side (the absolute rows/s move with whatever else the machine runs).
Every run is checked key by key against the sums pyarrow computes from the files.

Bytes written: ``write_bytes`` of this process's tree (the runner and its workers) *and*
the broker's process, sampled during each run (:mod:`bench.io_meter`), per input byte (84
bytes a row, as in the other benchmarks); the broker's writes while the topic is filled are
reported apart (a Kafka user pays them whether or not millstream reads the topic).

The broker's share: every partition fetched whole by clients that only receive
(:mod:`bench.kafka_broker_alone`), its time and the broker's CPU seconds; with the Parquet
runs' CPU seconds (the runner's and every worker's) this bounds
the Kafka job's rows/s on this machine whatever the reader does (:func:`print_broker_bound`).

When the rows reach the mappers: every run's mappers write each ``map`` call's start and
end (:mod:`bench.kafka_timeline`); the report gives, per source, when the first mapper and
then every mapper got rows, when the last ``map`` ended and when the run ended.

Where the time goes: each partition reader alone (``KafkaPartitionReader.read`` against
``ParquetLogReader.read``, reading every row in batches of ``Tuning().batch_rows``), the
mapper's ``map`` alone on those batches, and a cProfile of the Kafka reader's loop.

Run::

    .venv/bin/python -m bench.kafka --rows 2000000 --pairs 3
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from bench.io_meter import ProcessTreeMeter
from bench.kafka_broker_alone import serve_all
from bench.kafka_mapper import VALUE_BYTES, KafkaPreAggregate
from bench.kafka_timeline import (
    TIMELINE_ENV,
    TimedKafkaPreAggregate,
    TimedPreAggregate,
    summarize,
)
from bench.keyed_sum_stores import expected_sums, stored_sums
from examples import keyed_sum

ROW_BYTES = 84
"""Input bytes per row (8 + 8 + 64 + a 4-byte offset, as in the other benchmarks)."""


# -- the broker and the topic ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def noida_broker(directory: Path) -> Iterator[tuple[str, int]]:
    """A noida-db broker on a free loopback port with its data under ``directory``;
    yields ``(bootstrap, pid)``."""
    noida = Path(sys.executable).parent / "noida-db"
    port = _free_port()
    command = [str(noida if noida.exists() else "noida-db"), "start", "--only", "kafka"]
    command += ["--kafka-port", str(port), "--data-dir", str(directory / "broker")]
    with (directory / "broker.log").open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("noida-db did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}", process.pid
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def fill_topic(bootstrap: str, topic: str, data: Path, partitions: int) -> None:
    """Create ``topic`` and produce every row of the Parquet files, partition by partition."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    for p in range(partitions):
        files = sorted((data / f"partition={p}").glob("*.parquet"))
        for file in files:
            table = pads.dataset(str(file), format="parquet").to_table()
            packed = np.empty((table.num_rows, VALUE_BYTES), dtype=np.uint8)
            packed[:, 0:8] = table["key"].to_numpy().astype("<i8").view(np.uint8).reshape(-1, 8)
            packed[:, 8:16] = table["value"].to_numpy().astype("<i8").view(np.uint8).reshape(-1, 8)
            payload = table["payload"].combine_chunks()
            packed[:, 16:] = np.frombuffer(payload.buffers()[1], dtype=np.uint8).reshape(-1, 64)
            for row in packed:
                value = row.tobytes()
                while True:
                    try:
                        producer.produce(topic, value=value, key=value[:8], partition=p)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("the topic was not filled")


# -- the runs ----------------------------------------------------------------------------------


def inputs(data: Path, bootstrap: str, topic: str) -> dict[str, Callable[[], Any]]:
    """The two inputs of the same rows, made anew for each run."""
    return {
        "parquet": lambda: ms.inputs.ParquetLog(str(data), columns=("key", "value")),
        "kafka": lambda: ms.inputs.KafkaTopic(bootstrap, topic, bounded=True),
        "kafka value only": lambda: ms.inputs.KafkaTopic(
            bootstrap, topic, bounded=True, columns=("value",)
        ),
    }


def run_job(
    source: str, make_input: Callable[[], Any], work: Path, broker_pid: int, expected: Any
) -> dict[str, Any]:
    """One drained run of the keyed sum: its wall time, the bytes written, the broker's CPU
    seconds and the job's (this process's and every worker's, the broker's left out)."""
    url = f"sqlite:///{work / f'state-{time.monotonic_ns()}.db'}"
    timeline = work / f"timeline-{time.monotonic_ns()}.txt"
    os.environ[TIMELINE_ENV] = str(timeline)
    processor = ms.Processor(
        mapper=TimedPreAggregate if source == "parquet" else TimedKafkaPreAggregate,
        reducer=keyed_sum.SumIntoStore,
        input=make_input(),
        store=url,
        num_reducers=2,
        name="keyed_sum",
    )
    meter = ProcessTreeMeter([os.getpid(), broker_pid], 0.2)
    meter.start()
    broker_cpu = cpu_seconds(broker_pid)
    job_cpu, started, at = tree_cpu_seconds(os.getpid(), broker_pid), time.monotonic(), time.time()
    ms.run_local(processor)
    wall, ended = time.monotonic() - started, time.time()
    job_cpu = tree_cpu_seconds(os.getpid(), broker_pid) - job_cpu
    broker_cpu = cpu_seconds(broker_pid) - broker_cpu
    report = meter.stop()
    if stored_sums(url, "keyed_sum") != expected:
        raise RuntimeError(f"{source}: the sums differ from the expected ones")
    broker = sum(p.written for p in report.processes if p.pid == broker_pid)
    return {
        "wall": wall,
        "write_bytes": report.write_bytes,
        "broker_write_bytes": broker,
        "broker_cpu_seconds": broker_cpu,
        "job_cpu_seconds": job_cpu,
        "timeline": summarize(timeline, at, ended),
    }


def _process_stats() -> dict[int, list[str]]:
    """Every process's ``/proc/<pid>/stat`` fields from the third (state) on, by pid."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stats[int(entry)] = (
                    Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                )
            except OSError:
                continue  # ended meanwhile
    return stats


def tree_cpu_seconds(root: int, leave_out: int) -> float:
    """CPU seconds of process ``root`` and every process under it but ``leave_out``'s tree,
    and of the children each has reaped (utime, stime, cutime, cstime): a worker that ended
    during a run counts in its parent's reaped children."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for pid, fields in _process_stats().items():
        children.setdefault(int(fields[1]), []).append(pid)
        ticks[pid] = sum(int(f) for f in fields[11:15])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid != leave_out:
            total += ticks.get(pid, 0)
            todo.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` and its children (the broker's
    launcher and the broker)."""
    ticks = sum(
        int(fields[11]) + int(fields[12])
        for child, fields in _process_stats().items()
        if pid in (child, int(fields[1]))
    )
    return ticks / os.sysconf("SC_CLK_TCK")


# -- where the time goes -------------------------------------------------------------------


def read_all(reader: Any, batch_rows: int) -> list[pa.RecordBatch]:
    """Every row of a bounded partition reader, in batches of ``batch_rows``."""
    batches, begin, token = [], 0, b""
    while True:
        result = reader.read(begin, begin + batch_rows, token)
        if result.batch is not None and result.batch.num_rows:
            batches.append(result.batch)
            begin += result.batch.num_rows
        token = result.continuation_token
        if result.end_of_input:
            return batches


def consume_only(bootstrap: str, topic: str) -> Any:
    """A bare confluent-kafka consumer with the reader's settings that only counts the
    records of partition 0 (what librdkafka and the broker cost without millstream)."""
    from confluent_kafka import TopicPartition

    class Counting:
        def __init__(self) -> None:
            self.consumer = ms.inputs.KafkaTopic(bootstrap, topic).consumer()
            self.consumer.assign([TopicPartition(topic, 0, 0)])

        def read(self, begin: int, end: int, token: bytes) -> Any:
            messages = self.consumer.consume(20_000, 1.0)
            done = any(m.error() is not None for m in messages)
            return _Counted(len(messages) - int(done), done)

        def close(self) -> None:
            self.consumer.close()

    return Counting()


class _Counted:
    def __init__(self, rows: int, done: bool) -> None:
        self.batch = pa.record_batch({"n": pa.nulls(rows, pa.int8())}) if rows else None
        self.continuation_token = b""
        self.end_of_input = done


def readers_alone(data: Path, bootstrap: str, broker_pid: int, topic: str) -> dict[str, Any]:
    """Each reader of partition 0 alone (wall and CPU seconds of this process, CPU seconds
    of the broker), then the mapper's ``map`` alone on what it read; medians of three
    rounds, the sources alternating."""
    batch_rows = ms.Tuning().batch_rows
    spec = ms.WorkerSpec("keyed_sum", "mapper", 0, "bench", num_mappers=2, num_reducers=2)
    kafka_mapper = KafkaPreAggregate(spec, {})
    mappers = {"parquet": keyed_sum.PreAggregate(spec, {})}
    readers = {s: (lambda m=m: m().reader(0)) for s, m in inputs(data, bootstrap, topic).items()}
    readers["consume only"] = lambda: consume_only(bootstrap, topic)
    figures: dict[str, dict[str, list[float]]] = {s: {} for s in readers}
    for _ in range(3):
        for source, make in readers.items():
            reader = make()
            started, cpu, broker = time.perf_counter(), time.process_time(), cpu_seconds(broker_pid)
            batches = read_all(reader, batch_rows)
            got = figures[source]
            got.setdefault("read_seconds", []).append(time.perf_counter() - started)
            got.setdefault("reader_cpu_seconds", []).append(time.process_time() - cpu)
            got.setdefault("broker_cpu_seconds", []).append(cpu_seconds(broker_pid) - broker)
            got.setdefault("rows", []).append(sum(b.num_rows for b in batches))
            reader.close()
            if source != "consume only":
                started = time.perf_counter()
                for batch in batches:
                    mappers.get(source, kafka_mapper).map(batch)
                got.setdefault("map_seconds", []).append(time.perf_counter() - started)
    return {s: {k: statistics.median(v) for k, v in got.items()} for s, got in figures.items()}


def profile_kafka_reader(bootstrap: str, topic: str, top: int = 12) -> str:
    """cProfile of reading topic partition 0 whole (the functions with the most own time)."""
    reader = ms.inputs.KafkaTopic(bootstrap, topic, bounded=True).reader(0)
    profile = cProfile.Profile()
    profile.enable()
    read_all(reader, ms.Tuning().batch_rows)
    profile.disable()
    reader.close()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- the driver ------------------------------------------------------------------------------


def print_broker_bound(
    parquet: list[dict[str, Any]], parquet_read_cpu: float, served: list[Any]
) -> None:
    """What the broker alone leaves of the Kafka job's rows/s against Parquet's.

    Reading the topic cannot cost the machine less than the broker's CPU in serving it
    (``served``: every partition fetched whole by clients that only receive), and the
    Kafka job does the Parquet job's work but its reading (``parquet_read_cpu``) beside it,
    so on this machine's cores the Kafka job takes at least (the Parquet job's CPU - its
    reading's + the broker's) / cores, whatever the reader does."""
    cores = os.cpu_count() or 1
    wall = statistics.median(r["wall"] for r in parquet)
    job = statistics.median(r["job_cpu_seconds"] for r in parquet)
    broker = statistics.median(s.broker_cpu_seconds for s in served)
    seconds = statistics.median(s.seconds for s in served)
    least = (job - parquet_read_cpu + broker) / cores
    print(
        f"\nThe broker alone: every partition served whole to clients that only receive in "
        f"{seconds:.2f} s (medians of {len(served)}), {broker:.2f} CPU s. The Parquet job: "
        f"{wall:.2f} s, {job:.2f} CPU s, {parquet_read_cpu:.2f} of them reading. On {cores} "
        f"cores a Kafka job takes at least ({job:.2f} - {parquet_read_cpu:.2f} + "
        f"{broker:.2f}) / {cores} = {least:.2f} s: Kafka / Parquet rows/s "
        f"<= {wall / max(least, wall):.2f} with a reader that cost nothing."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--pairs", type=int, default=3, help="alternating runs of each source")
    parser.add_argument("--work", type=Path, default=None, help="working directory (temporary)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="millstream-bench-kafka-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        data = keyed_sum.generate(work, args.rows)
        expected = expected_sums(data)
        with noida_broker(work) as (bootstrap, broker_pid):
            topic = "keyed-sum"
            meter = ProcessTreeMeter([os.getpid(), broker_pid], 0.2)
            meter.start()
            started = time.monotonic()
            fill_topic(bootstrap, topic, data, keyed_sum.PARTITIONS)
            fill_seconds = time.monotonic() - started
            fill = meter.stop()
            fill_broker = sum(p.written for p in fill.processes if p.pid == broker_pid)
            print(f"topic filled in {fill_seconds:.1f} s", file=sys.stderr)
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in inputs(data, "", "")}
            for source, make in inputs(data, bootstrap, topic).items():  # warm-up, not counted
                run_job(source, make, work, broker_pid, expected)
            for pair in range(args.pairs):
                for source, make in inputs(data, bootstrap, topic).items():
                    run = run_job(source, make, work, broker_pid, expected)
                    runs[source].append(run)
                    print(f"pair {pair} {source}: {run}", file=sys.stderr)
            alone = readers_alone(data, bootstrap, broker_pid, topic)
            ends = [args.rows // keyed_sum.PARTITIONS] * keyed_sum.PARTITIONS
            served = [
                serve_all(bootstrap, topic, ends, lambda: cpu_seconds(broker_pid)) for _ in range(3)
            ]
            profile = profile_kafka_reader(bootstrap, topic)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    input_bytes = args.rows * ROW_BYTES
    ratios = {
        source: [p["wall"] / k["wall"] for p, k in zip(runs["parquet"], rs, strict=True)]
        for source, rs in runs.items()
        if source != "parquet"
    }
    print(f"\n{args.rows:,} rows, {args.pairs} alternating rounds, medians\n")
    print(
        "| source | wall s | rows/s | written bytes per input byte (broker's) | broker CPU s "
        "| job CPU s |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for source, rs in runs.items():
        wall = statistics.median(r["wall"] for r in rs)
        written = statistics.median(r["write_bytes"] for r in rs) / input_bytes
        broker = statistics.median(r["broker_write_bytes"] for r in rs) / input_bytes
        cpu = statistics.median(r["broker_cpu_seconds"] for r in rs)
        job_cpu = statistics.median(r["job_cpu_seconds"] for r in rs)
        print(
            f"| {source} | {wall:.2f} | {args.rows / wall:,.0f} | {written:.3f} ({broker:.3f}) "
            f"| {cpu:.2f} | {job_cpu:.2f} |"
        )
    for source, rs in ratios.items():
        print(
            f"\n{source} / parquet rows/s, per round: {', '.join(f'{r:.2f}' for r in rs)}; "
            f"median {statistics.median(rs):.2f}"
        )
    print(
        f"Filling the topic: {fill_seconds:.1f} s, the broker wrote "
        f"{fill_broker / input_bytes:.2f} bytes per input byte"
    )
    print("\nPartition 0's reader alone, then map alone (medians of 3, alternating):\n")
    print("| reader | read rows/s | reader CPU µs/row | broker CPU µs/row | map rows/s |")
    print("| --- | --- | --- | --- | --- |")
    for source, f in alone.items():
        n = f["rows"]
        mapped = f"{n / f['map_seconds']:,.0f}" if "map_seconds" in f else "-"
        print(
            f"| {source} | {n / f['read_seconds']:,.0f} | "
            f"{f['reader_cpu_seconds'] / n * 1e6:.2f} | {f['broker_cpu_seconds'] / n * 1e6:.2f} "
            f"| {mapped} |"
        )
    # Partition 0's reader alone, for every partition.
    parquet_read_cpu = alone["parquet"]["reader_cpu_seconds"] * keyed_sum.PARTITIONS
    print_broker_bound(runs["parquet"], parquet_read_cpu, served)
    print("\nWhen the mappers got their rows, seconds after the run's start (medians):\n")
    print("| source | first rows | every mapper has rows | last map ended | run ended |")
    print("| --- | --- | --- | --- | --- |")
    for source, rs in runs.items():
        t = {k: statistics.median(r["timeline"][k] for r in rs) for k in rs[0]["timeline"]}
        print(
            f"| {source} | {t['first_rows']:.2f} | {t['every_mapper_has_rows']:.2f} "
            f"| {t['last_map_ended']:.2f} | {t['run_ended']:.2f} |"
        )
    print("\ncProfile of the Kafka reader reading partition 0:\n")
    print(profile)
    if args.json is not None:
        figures = {"rows": args.rows, "runs": runs, "ratios": ratios, "alone": alone}
        figures["broker_alone"] = [vars(s) for s in served]
        figures |= {"fill_seconds": fill_seconds, "fill_broker_write_bytes": fill_broker}
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
