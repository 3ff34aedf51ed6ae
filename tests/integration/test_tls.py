"""Mutual TLS on GetRows: a processor runs exact over it, and nobody without a certificate
from the processor's CA gets rows or makes a mapper drop any."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from millstream import _core
from millstream.exceptions import ConfigurationError
from millstream.rpc.calls import GetRowsCall, GetRowsResult
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer
from millstream.rpc.tls import tls_files
from millstream.runner.local import LocalRunner
from millstream.tuning import Tuning

from tests.support.jobs import (
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)
from tests.support.tls_files import SERVER_NAME, make_certificates

GUID = "mapper-guid"


class Handler:
    """Serves GetRows from a real window and records every call that reached it."""

    def __init__(self) -> None:
        self.window = _core.Window(1, 1 << 24)
        batch = pa.record_batch({"x": pa.array(range(100), pa.int64())})
        self.window.push(batch, pa.array([0] * 100, pa.int32()), 100, b"t")
        self.calls = 0

    def handle_get_rows(
        self, reducer_index: int, committed: int, max_rows: int, max_bytes: int, mapper_guid: str
    ) -> tuple[int, int, bytes]:
        self.calls += 1
        return self.window.get_rows(reducer_index, committed, max_rows, max_bytes)


def _tuning(files: dict[str, Path]) -> Tuning:
    return Tuning(
        tls_ca_file=str(files["ca"]),
        tls_cert_file=str(files["cert"]),
        tls_key_file=str(files["key"]),
        tls_server_name=SERVER_NAME,
    )


def _call(address: str, committed: int = -1) -> GetRowsCall:
    return GetRowsCall(0, address, GUID, 0, committed, 10, 1 << 20)


def test_mutual_tls_serves_the_processor_and_refuses_everyone_else(tmp_path: Path) -> None:
    ours = tls_files(_tuning(make_certificates(tmp_path)))
    theirs = tls_files(_tuning(make_certificates(tmp_path, "other-")))
    assert ours is not None
    assert theirs is not None
    handler = Handler()
    server = RowsServer(
        handler, "127.0.0.1:0", 1 << 20, 1 << 16, credentials=ours.server_credentials()
    )
    address = f"127.0.0.1:{server.port}"
    clients = {
        "plaintext": GrpcRowsClient(5.0, 1 << 20),
        "no certificate": GrpcRowsClient(
            5.0,
            1 << 20,
            credentials=grpc.ssl_channel_credentials(root_certificates=ours.ca),
            server_name=SERVER_NAME,
        ),
        "another CA's certificate": GrpcRowsClient(
            5.0,
            1 << 20,
            credentials=grpc.ssl_channel_credentials(ours.ca, theirs.key, theirs.cert),
            server_name=SERVER_NAME,
        ),
    }
    try:
        for who, client in clients.items():
            # A forged claim that every row is committed: refused before the mapper sees it.
            (result,) = client.get_rows_many([_call(address, committed=10**9)])
            assert isinstance(result, grpc.RpcError), who
            assert result.code() == grpc.StatusCode.UNAVAILABLE, who
        assert handler.calls == 0
        assert handler.window.bucket_len(0) == 100  # the window lost nothing
        member = GrpcRowsClient(
            5.0, 1 << 20, credentials=ours.channel_credentials(), server_name=ours.server_name
        )
        clients["member"] = member
        (result,) = member.get_rows_many([_call(address)])
        assert isinstance(result, GetRowsResult)
        assert (result.row_count, result.last_shuffle_row_index) == (10, 9)
    finally:
        for client in clients.values():
            client.close()
        server.stop(0)


def test_a_processor_over_mutual_tls_is_exact(tmp_path: Path) -> None:
    files = make_certificates(tmp_path / "tls")
    data = write_keyed_input(tmp_path / "in", 30_000, partitions=2)
    tls = _tuning(files)
    tune = tuning(
        tls_ca_file=tls.tls_ca_file,
        tls_cert_file=tls.tls_cert_file,
        tls_key_file=tls.tls_key_file,
        tls_server_name=SERVER_NAME,
    )
    processor = keyed_processor(data, tmp_path / "state.db", tune=tune)
    summary = LocalRunner(processor).run(timeout=120)
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == 30_000


def test_tls_files_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = make_certificates(tmp_path)
    monkeypatch.setenv("MILLSTREAM_TLS_CA_FILE", str(files["ca"]))
    monkeypatch.setenv("MILLSTREAM_TLS_CERT_FILE", str(files["cert"]))
    monkeypatch.setenv("MILLSTREAM_TLS_KEY_FILE", str(files["key"]))
    monkeypatch.setenv("MILLSTREAM_TLS_SERVER_NAME", SERVER_NAME)
    loaded = tls_files(Tuning())
    assert loaded is not None
    assert loaded.ca == files["ca"].read_bytes()
    assert loaded.server_name == SERVER_NAME


def test_half_configured_or_unreadable_tls_is_a_clear_error(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    full = _tuning(files)
    assert tls_files(Tuning()) is None
    with pytest.raises(ConfigurationError, match=r"tls_key_file \(or MILLSTREAM_TLS_KEY_FILE\)"):
        tls_files(dataclasses.replace(full, tls_key_file=None))
    with pytest.raises(ConfigurationError, match=r"cannot read tls_cert_file .*missing\.pem"):
        tls_files(dataclasses.replace(full, tls_cert_file=str(tmp_path / "missing.pem")))
    (tmp_path / "plain.txt").write_text("not a certificate")
    with pytest.raises(ConfigurationError, match="not a PEM file"):
        tls_files(dataclasses.replace(full, tls_ca_file=str(tmp_path / "plain.txt")))
