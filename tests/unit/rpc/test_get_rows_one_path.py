"""One GetRows path: the in-process transport that tests and simulations use answers every
call exactly as the gRPC server does (both are adapters over
:func:`millstream.rpc.serving.serve_get_rows`), so tests exercise the code production runs.

Twin mappers (same input, same GUID, same calls) serve one through each transport; any
request, valid or not, must get the same rows or the same kind of refusal.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import millstream as ms
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from millstream.exceptions import CommittedIndexError, StaleMapperError
from millstream.rpc import millstream_pb2, millstream_pb2_grpc
from millstream.rpc.calls import GetRowsCall
from millstream.rpc.server import RowsServer
from millstream.testing import InProcessTransport, MemoryInput
from millstream.workers import MapperWorker

GUID = "twin"
CAP = 4_096
"""Both transports' byte cap of one answer."""

CALL = st.fixed_dictionaries(
    {
        "guid": st.sampled_from([GUID, GUID, "other"]),
        "reducer": st.integers(-1, 2),
        "committed": st.integers(-2, 700),
        "count": st.one_of(st.integers(-2, 0), st.integers(1, 400)),
        "max_bytes": st.sampled_from([-1, 0, 1, 600, CAP, 1 << 20]),
        "after": st.one_of(st.none(), st.integers(-2, 700)),
        "shuffle_indices": st.booleans(),
        "gather_rows": st.integers(0, 50),
    }
)


class ByKey(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class Count(ms.Reducer):
    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        txn.add(("rows",), batch.num_rows)


def _twin(tmp_path: Path, name: str) -> MapperWorker:
    table = pa.table({"key": pa.array(range(600), pa.int64()), "pad": pa.array(["x" * 20] * 600)})
    processor = ms.Processor(
        mapper=ByKey,
        reducer=Count,
        input=MemoryInput([table]),
        store=f"sqlite:///{tmp_path / f'{name}.db'}",
        num_reducers=2,
        tuning=ms.Tuning(batch_rows=200),
    )
    worker = MapperWorker(processor, 0, processor.open_store(), guid=GUID)
    worker.start_ingestion()
    for _ in range(2):
        worker.ingest_once()
    return worker


@pytest.fixture
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("one-path")


def _over_grpc(stub: Any, call: GetRowsCall) -> tuple[object, ...]:
    request = millstream_pb2.GetRowsRequest(
        count=call.max_rows,
        reducer_index=call.reducer_index,
        committed_row_index=call.committed_row_index,
        mapper_guid=call.mapper_guid,
        max_bytes=call.max_bytes,
        gather_rows=call.gather_rows,
        shuffle_indices=call.shuffle_indices,
    )
    if call.after_row_index is not None:
        request.after_row_index = call.after_row_index
    try:
        r = stub.GetRows(request, timeout=10)
    except grpc.RpcError as exc:
        return ("refused", exc.code().name)
    return (r.row_count, r.last_shuffle_row_index, r.arrow_ipc, r.behind, r.input_ended)


def _in_process(transport: InProcessTransport, call: GetRowsCall) -> tuple[object, ...]:
    try:
        r = transport.serve(call)
    except StaleMapperError:
        return ("refused", "FAILED_PRECONDITION")
    except (CommittedIndexError, ValueError):
        return ("refused", "INVALID_ARGUMENT")
    except Exception:  # what gRPC answers for an error the servicer does not handle
        return ("refused", "UNKNOWN")
    return (r.row_count, r.last_shuffle_row_index, r.arrow_ipc, r.behind, r.input_ended)


@contextlib.contextmanager
def _twins(root: Path) -> Iterator[tuple[InProcessTransport, Any]]:
    """Twin mappers: one served in process, one by a gRPC server (stub to it)."""
    root.mkdir()
    local, remote = _twin(root, "local"), _twin(root, "remote")
    server = RowsServer(remote, "127.0.0.1:0", 1 << 20, CAP)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    transport = InProcessTransport({"local": local}, max_response_bytes=CAP)
    yield transport, millstream_pb2_grpc.MapperStub(channel)  # type: ignore[no-untyped-call]
    channel.close()
    server.stop(0)
    for worker in (local, remote):
        store = worker.store
        worker.close()
        store.close()


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(CALL, min_size=1, max_size=12))
def test_in_process_and_grpc_answer_alike(tmp_root: Path, calls: list[dict[str, Any]]) -> None:
    # A fresh pair of twins per example: calls change the windows (they pop buckets).
    with _twins(tmp_root / uuid.uuid4().hex) as (transport, stub):
        _compare(transport, stub, calls)


def _compare(transport: InProcessTransport, stub: Any, calls: list[dict[str, Any]]) -> None:
    for fields in calls:
        call = GetRowsCall(
            mapper_index=0,
            address="local",
            mapper_guid=fields["guid"],
            reducer_index=fields["reducer"],
            committed_row_index=fields["committed"],
            max_rows=fields["count"],
            max_bytes=fields["max_bytes"],
            gather_rows=fields["gather_rows"],
            after_row_index=fields["after"],
            shuffle_indices=fields["shuffle_indices"],
        )
        assert _in_process(transport, call) == _over_grpc(stub, call), call
