"""GetRows errors reveal no mapper instance id (issue 42 item 7).

A mapper instance's GUID is the only credential a GetRows carries besides reaching the
server: whoever knows it can claim commits and make the mapper drop rows (and restart).
So no answer to a caller that does not know it (an error, a status) may name it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import StaleMapperError
from millstream.rpc import millstream_pb2, millstream_pb2_grpc
from millstream.rpc.calls import GetRowsCall
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer
from millstream.testing import InProcessTransport, MemoryInput
from millstream.workers import MapperWorker

GUIDS = ("9f0c1d2e3a4b5c6d7e8f90a1b2c3d4e5", "0a1b2c3d4e5f60718293a4b5c6d7e8f9")


class ByKey(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class Count(ms.Reducer):
    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        txn.add(("rows",), batch.num_rows)


@pytest.fixture
def mappers(tmp_path: Path) -> Iterator[list[MapperWorker]]:
    """Two mapper instances (one worker reading two partitions) with rows in their windows."""
    table = pa.table({"key": pa.array(range(200), pa.int64())})
    processor = ms.Processor(
        mapper=ByKey,
        reducer=Count,
        input=MemoryInput([table, table]),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=2,
        tuning=ms.Tuning(batch_rows=100),
    )
    store = processor.open_store()
    workers = [MapperWorker(processor, p, store, guid=GUIDS[p]) for p in range(2)]
    for worker in workers:
        worker.start_ingestion()
        worker.ingest_once()
    yield workers
    for worker in workers:
        worker.close()
    store.close()


def _details(address: str, mapper_guid: str) -> str:
    """The error details a caller outside the processor gets for ``mapper_guid``."""
    with grpc.insecure_channel(address) as channel:
        stub = millstream_pb2_grpc.MapperStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetRows(
                millstream_pb2.GetRowsRequest(
                    count=10, reducer_index=0, committed_row_index=-1, mapper_guid=mapper_guid
                ),
                timeout=5,
            )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return str(caught.value.details())


@pytest.mark.parametrize("served", ["one instance", "two instances"])
@pytest.mark.parametrize("asked", ["", "guess", GUIDS[0][:8], GUIDS[0] + "x"])
def test_a_stale_instance_error_names_no_instance(
    mappers: list[MapperWorker], served: str, asked: str
) -> None:
    handlers = mappers[0] if served == "one instance" else {w.guid: w for w in mappers}
    server = RowsServer(handlers, "127.0.0.1:0", 1 << 20, 1 << 16)
    try:
        details = _details(f"127.0.0.1:{server.port}", asked)
    finally:
        server.stop(0)
    assert "stale" in details  # still says what is wrong and what to do
    for guid in GUIDS:
        assert guid not in details, details
        assert guid[:8] not in details.replace(asked, ""), details


def test_a_reducer_still_learns_which_instance_it_asked_for(mappers: list[MapperWorker]) -> None:
    """The reducer's own error names the instance it called (it knew it already), through
    gRPC and in process alike, and never the instance that serves the address."""
    server = RowsServer(mappers[0], "127.0.0.1:0", 1 << 20, 1 << 16)
    address = f"127.0.0.1:{server.port}"
    call = GetRowsCall(0, address, "old-instance", 0, -1, 10, 1 << 16)
    client = GrpcRowsClient(5.0, 1 << 20)
    try:
        (over_grpc,) = client.get_rows_many([call])
    finally:
        client.close()
        server.stop(0)
    in_process = InProcessTransport({address: mappers[0]}).get_rows_many([call])[0]
    for error in (over_grpc, in_process):
        assert isinstance(error, StaleMapperError), error
        assert GUIDS[0] not in str(error)
    assert "old-instance" in str(over_grpc)
