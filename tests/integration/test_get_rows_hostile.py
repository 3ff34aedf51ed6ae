"""GetRows under hostile callers (issue 42): while real mappers and reducers run (threads of
this process, real gRPC on loopback), a client outside the processor sends arbitrary,
forged and replayed requests: any GUID (the real one included), reducer index, committed
index, fetch position, caps and waits. Nothing is lost or duplicated (the committed sums are
exact against the input), the mappers keep serving the real reducers (the run drains), and
no error names an instance the caller did not name itself.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import millstream as ms
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from millstream.ledger import list_workers, read_reducer_state
from millstream.rpc import millstream_pb2, millstream_pb2_grpc
from millstream.workers import run_worker

from tests.support.jobs import (
    KeyedSumMapper,
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)

INT64 = st.integers(-(2**63), 2**63 - 1)

ATTACKED = threading.Event()
"""Set once the hostile client has sent its last request."""

ANSWERS = {
    grpc.StatusCode.FAILED_PRECONDITION,  # a GUID this server does not serve
    grpc.StatusCode.INVALID_ARGUMENT,  # an index or a cap out of range, or going backwards
}
"""What a hostile request may get besides rows: a clear refusal, never an unhandled error."""


class HeldBackMapper(KeyedSumMapper):
    """Maps slowly while the attack lasts, and holds its last batches until it ends: the
    run cannot drain before every hostile request has reached a live mapper."""

    calls = 0

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        self.calls += 1
        ATTACKED.wait(0.05 if self.calls < 10 else 30.0)
        return super().map(batch)


REQUEST = st.fixed_dictionaries(
    {
        "mapper": st.integers(0, 1),
        "guid": st.sampled_from(["real", "real", "other mapper", "empty", "junk"]),
        "reducer": st.one_of(st.integers(0, 1), st.integers(-2, 4), INT64),
        # replay: an index the reducer committed (an old acknowledgement, sent again);
        # forged: beyond what it committed; any: whatever fits in the field.
        "committed": st.one_of(
            st.tuples(st.just("replay"), st.integers(0, 3)),
            st.tuples(st.just("forged"), st.integers(1, 10**6)),
            st.tuples(st.just("any"), st.one_of(st.integers(-3, 10**5), INT64)),
        ),
        "count": st.one_of(st.integers(-2, 5_000), INT64),
        "max_bytes": st.one_of(st.integers(-2, 1 << 20), INT64),
        "wait_ms": st.integers(-5, 150),
        "gather_rows": st.one_of(st.just(0), st.integers(-2, 10**6)),
        "after": st.one_of(st.none(), st.integers(-2, 10**5), INT64),
        "shuffle_indices": st.booleans(),
        "start_in_ms": st.integers(-5, 60),
        "pause_ms": st.integers(0, 60),
    }
)


class _Workers:
    """Mapper and reducer workers of one processor, each in a thread of this process."""

    def __init__(self, processor: ms.Processor) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(processor, role, index), daemon=True)
            for role, count in (("mapper", processor.num_mappers), ("reducer", 2))
            for index in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, processor: ms.Processor, role: str, index: int) -> None:
        try:
            run_worker(processor, role, index, self.stop)
        except BaseException as exc:
            self.errors.append(exc)

    def wait(self, timeout: float) -> bool:
        """Whether every worker finished (drained) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def _mappers(processor: ms.Processor) -> dict[int, tuple[str, str]]:
    """Mapper index -> (address, GUID) once every mapper is in discovery."""
    store = processor.open_store()
    try:
        for _ in range(600):
            with store.read() as txn:
                found = {w.index: (w.address, w.guid) for w in list_workers(txn, "mapper")}
            if len(found) == processor.num_mappers:
                return found
            time.sleep(0.02)
    finally:
        store.close()
    raise AssertionError("the mappers never registered")


def _committed(processor: ms.Processor, reducer: int, mapper: int) -> int:
    store = processor.open_store()
    try:
        with store.read() as txn:
            state = read_reducer_state(txn, reducer, processor.num_partitions)
        return state.committed_row_indices[mapper]
    finally:
        store.close()


def _request(
    processor: ms.Processor, mappers: dict[int, tuple[str, str]], fields: dict[str, Any]
) -> tuple[str, millstream_pb2.GetRowsRequest]:
    m = fields["mapper"]
    address, guid = mappers[m]
    mapper_guid = {
        "real": guid,
        "other mapper": mappers[1 - m][1],
        "empty": "",
        "junk": guid[::-1],
    }[fields["guid"]]
    reducer = fields["reducer"]
    kind, value = fields["committed"]
    if kind == "any":
        committed = value
    else:
        real = _committed(processor, reducer, m) if 0 <= reducer < 2 else -1
        committed = real - value if kind == "replay" else real + value
    request = millstream_pb2.GetRowsRequest(
        count=fields["count"],
        reducer_index=reducer,
        committed_row_index=max(-(2**63), committed),
        mapper_guid=mapper_guid,
        max_bytes=fields["max_bytes"],
        wait_ms=fields["wait_ms"],
        gather_rows=fields["gather_rows"],
        shuffle_indices=fields["shuffle_indices"],
        start_in_ms=fields["start_in_ms"],
    )
    if fields["after"] is not None:
        request.after_row_index = fields["after"]
    return address, request


@settings(
    max_examples=5,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(requests=st.lists(REQUEST, min_size=4, max_size=20))
def test_hostile_get_rows_lose_nothing_and_stop_nobody(
    tmp_path_factory: Any, requests: list[dict[str, Any]]
) -> None:
    root: Path = tmp_path_factory.mktemp("hostile")
    data = write_keyed_input(root / "in", 24_000, partitions=2, file_rows=2_000)
    processor = keyed_processor(
        data,
        root / "state.db",
        mapper=HeldBackMapper,
        tune=tuning(batch_rows=1_000, gather_seconds=0.0),
    )
    ATTACKED.clear()
    workers = _Workers(processor)
    revealed: list[str] = []
    refused: list[str] = []
    try:
        mappers = _mappers(processor)
        guids = {guid for _, guid in mappers.values()}
        for fields in requests:
            address, request = _request(processor, mappers, fields)
            with grpc.insecure_channel(address) as channel:
                stub = millstream_pb2_grpc.MapperStub(channel)  # type: ignore[no-untyped-call]
                try:
                    stub.GetRows(request, timeout=5)
                except grpc.RpcError as exc:
                    details = str(exc.details())
                    if exc.code() not in ANSWERS:
                        refused.append(f"{exc.code()}: {details} for {request}")
                    revealed += [g for g in guids if g in details and g != request.mapper_guid]
            time.sleep(fields["pause_ms"] / 1000)
        ATTACKED.set()
        drained = workers.wait(90)
    finally:
        ATTACKED.set()
        workers.halt()
    assert not workers.errors, workers.errors
    assert drained, "the run did not drain: a mapper stopped serving its reducers"
    assert not revealed, f"errors named instances the caller did not name: {revealed}"
    assert not refused, "\n".join(refused)
    assert read_output(processor, "sum") == expected_sums(data)
