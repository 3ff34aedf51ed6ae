"""Prometheus metrics of a running processor, scraped over HTTP from the runner's endpoint
(a real ``prometheus_client`` server, real worker processes) and checked against the truth:
the input's size, the store's totals and the restarts the runner made."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import ConfigurationError
from millstream.ledger import summarize
from millstream.runner.local import LocalRunner
from millstream.workers.prometheus import COMMIT_SECONDS_BUCKETS

from tests.support.jobs import (
    PassThroughMapper,
    RowsReducer,
    keyed_processor,
    tuning,
    write_keyed_input,
)
from tests.support.metrics import scrape, total
from tests.support.readme import JOB, ROOT, write_data
from tests.support.sockets import listening_hosts

ROWS = 20_000
PER_PARTITION = ROWS // 2


class SlowPassThroughMapper(PassThroughMapper):
    """Every row to its reducer, slowly enough for a scrape to see the run under way."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        time.sleep(0.1)
        return super().map(batch)


def _unreachable(port: int) -> bool:
    try:
        scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


def test_scraped_metrics_match_the_input_the_store_and_the_restarts(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS)
    processor = keyed_processor(
        data,
        tmp_path / "state.db",
        mapper=SlowPassThroughMapper,
        reducer=RowsReducer,
        tune=tuning(batch_rows=500),
    )
    runner = LocalRunner(processor, metrics_port=0)
    runner.start()
    try:
        assert runner.metrics is not None
        port = runner.metrics.port
        lags: dict[str, list[float]] = {"0": [], "1": []}
        killed = False
        deadline = time.monotonic() + 240
        while not runner.poll():
            assert time.monotonic() < deadline, "the run did not drain within 240 s"
            samples = scrape(port)
            for partition, seen in lags.items():
                lag = (
                    "millstream_lag_rows",
                    (("index", partition), ("partition", partition), ("role", "mapper")),
                )
                if lag in samples:
                    seen.append(samples[lag])
            read = total(samples, "millstream_rows_read_total", role="mapper", index="0")
            if not killed and 0 < read < PER_PARTITION:
                os.kill(runner.pids()[("mapper", 0, 0)], signal.SIGKILL)
                killed = True
            time.sleep(0.2)
        final = scrape(port)
        store = processor.open_store()
        try:
            truth = summarize(store, processor.info, runner.restarts, 0.0)
        finally:
            store.close()
    finally:
        runner.stop()

    assert killed, "mapper 0 finished before the test could kill it"
    for partition, seen in lags.items():
        assert any(lag > 0 for lag in seen), f"partition {partition} never showed lag"
        labels = {"role": "mapper", "index": partition, "partition": partition}
        assert total(final, "millstream_lag_rows", **labels) == 0
        assert total(final, "millstream_persisted_input_row_index", **labels) == PER_PARTITION
    # Exactly once: a killed mapper replays its rows, but each is committed once.
    assert total(final, "millstream_rows_committed_total") == ROWS == truth.rows_reduced
    assert total(final, "millstream_rows_read_total", partition="1") == PER_PARTITION
    assert total(final, "millstream_rows_read_total", partition="0") >= PER_PARTITION
    assert total(final, "millstream_bytes_shuffled_total") == truth.bytes_shuffled
    commits = total(final, "millstream_commits_total")
    assert commits == truth.commits > 0
    assert total(final, "millstream_commit_seconds_count") == commits
    assert total(final, "millstream_transaction_bytes_count") == commits
    assert total(final, "millstream_commit_seconds_bucket", le="+Inf") == commits
    assert total(final, "millstream_transaction_bytes_sum") > 0
    buckets = [
        total(final, "millstream_commit_seconds_bucket", le=str(le))
        for le in COMMIT_SECONDS_BUCKETS
    ]
    assert buckets == sorted(buckets), "histogram buckets are cumulative"
    assert buckets[-1] <= commits
    # Where the reducers' time went; slow mappers keep them waiting for answers.
    for activity in ("store", "reduce", "mapper_wait"):
        assert total(final, f"millstream_reducer_{activity}_seconds_total") > 0, activity
    assert runner.restarts == 1
    assert total(final, "millstream_restarts_total", role="mapper", index="0") == 1
    assert total(final, "millstream_restarts_total") == 1
    assert _unreachable(port), "the metrics port is still served after the run stopped"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_millstream_run_serves_metrics_on_the_port_it_is_given(tmp_path: Path) -> None:
    write_data(tmp_path, rows=8_000)
    (tmp_path / "job.py").write_text(JOB)
    port = _free_port()
    env = {
        **os.environ,
        "JOB_STORE": f"sqlite:///{tmp_path / 'state.db'}",
        "JOB_MAP_SLEEP": "0.1",
        "PYTHONPATH": str(ROOT),
    }
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "millstream",
            "run",
            "job.py:processor",
            "--metrics-port",
            str(port),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lags: list[float] = []
    try:
        while run.poll() is None:
            try:
                samples = scrape(port)
            except (urllib.error.URLError, ConnectionError):
                samples = {}
            lags.extend(v for (name, _), v in samples.items() if name == "millstream_lag_rows")
            time.sleep(0.2)
        out, err = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert "drained: 8,000 rows read" in out
    assert f"metrics on http://localhost:{port}/metrics" in err
    assert any(lag > 0 for lag in lags), "no scrape saw a mapper behind its input"
    assert _unreachable(port), "the metrics port is still served after the run ended"


def test_a_port_already_in_use_stops_the_run_naming_it(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 1_000)
    processor = keyed_processor(data, tmp_path / "state.db")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            LocalRunner(processor, metrics_port=port).run(timeout=60)


@pytest.mark.parametrize("host", [None, "0.0.0.0", "127.0.0.2"])
def test_the_runners_metrics_listen_on_loopback_unless_told_otherwise(
    tmp_path: Path, host: str | None
) -> None:
    data = write_keyed_input(tmp_path / "in", 1_000)
    processor = keyed_processor(data, tmp_path / "state.db")
    chosen = {} if host is None else {"metrics_host": host}
    runner = LocalRunner(processor, metrics_port=0, **chosen)
    try:
        runner.start()
        assert runner.metrics is not None
        assert listening_hosts(runner.metrics.port) == {host or "127.0.0.1"}
    finally:
        runner.stop()


@pytest.mark.parametrize("host", [None, "0.0.0.0"])
def test_millstream_metrics_listens_on_loopback_unless_told_otherwise(
    tmp_path: Path, host: str | None
) -> None:
    chosen = [] if host is None else ["--host", host]
    command = [sys.executable, "-m", "millstream", "metrics", str(tmp_path), "--port", "0"]
    server = subprocess.Popen(command + chosen, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        assert "/metrics" in line, line
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        assert listening_hosts(port, server.pid) == {host or "127.0.0.1"}
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)


WORKER = """
import sys
from pathlib import Path

from tests.support.jobs import PassThroughMapper, RowsReducer, keyed_processor
from millstream.workers import run_worker

data, state, role = sys.argv[1:4]
processor = keyed_processor(
    Path(data), Path(state), num_reducers=1, mapper=PassThroughMapper, reducer=RowsReducer
)
run_worker(processor, role, 0)
"""


def test_millstream_metrics_serves_what_workers_without_a_runner_write(tmp_path: Path) -> None:
    """As on a Spark executor: workers started by something else than the local runner,
    with ``PROMETHEUS_MULTIPROC_DIR`` set, and ``millstream metrics`` serving the directory."""
    rows = 6_000
    data = write_keyed_input(tmp_path / "in", rows, partitions=1)
    directory = tmp_path / "metrics"
    directory.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "millstream", "metrics", str(directory), "--port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        assert "/metrics" in line, line
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(data), str(tmp_path / "state.db"), role],
                env={**env, "PROMETHEUS_MULTIPROC_DIR": str(directory)},
            )
            for role in ("mapper", "reducer")
        ]
        for worker in workers:
            assert worker.wait(timeout=240) == 0
        samples = scrape(port)
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    assert server.returncode == 0
    assert total(samples, "millstream_rows_committed_total", role="reducer", index="0") == rows
    assert total(samples, "millstream_rows_read_total", role="mapper", partition="0") == rows
    assert total(samples, "millstream_lag_rows", role="mapper", partition="0") == 0
    assert total(samples, "millstream_commit_seconds_count") > 0
    assert _unreachable(port)
