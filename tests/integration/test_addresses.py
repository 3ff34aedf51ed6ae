"""Where a mapper's GetRows server listens and what it advertises in discovery.

The local runner's workers (``run_worker`` with its default host) bind and advertise
loopback only; a worker given its host's address (a Spark executor's) binds only that
address, so a reducer that dials any other address fails instead of working by accident;
``Tuning.bind_host`` opens every interface on request.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import millstream as ms
import pytest
from millstream.exceptions import ConfigurationError
from millstream.inputs.store_queue import StoreQueue
from millstream.ledger import WorkerInfo, list_workers
from millstream.rpc.address import MapperAddress, host_port, is_loopback, mapper_address
from millstream.runner.local import LocalRunner
from millstream.workers import run_worker

from examples.keyed_sum import PreAggregate, SumIntoStore
from tests.support.sockets import listening_hosts

pytestmark = pytest.mark.timeout(60)


def processor_for(tmp_path: Path, tuning: ms.Tuning) -> ms.Processor:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    return ms.Processor(
        mapper=PreAggregate,
        reducer=SumIntoStore,
        input=StoreQueue(url, "input", 1, prefix=("addresses",)),
        store=url,
        num_reducers=1,
        name="addresses",
        tuning=tuning,
    )


def registered_mapper(processor: ms.Processor, timeout: float = 30) -> WorkerInfo:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        store = processor.open_store()
        try:
            txn = store.create_transaction()
            try:
                found = list_workers(txn, "mapper")
            finally:
                txn.reset()
        finally:
            store.close()
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("the mapper did not register")


@contextmanager
def running_mapper(processor: ms.Processor, **kwargs: str) -> Iterator[WorkerInfo]:
    """Mapper 0 of ``processor`` in a thread (its input stays open), until the caller is done."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run_worker(processor, "mapper", 0, stop, **kwargs)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield registered_mapper(processor)
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def test_a_local_worker_binds_and_advertises_loopback_only(tmp_path: Path) -> None:
    processor = processor_for(tmp_path, ms.Tuning(heartbeat_seconds=0.1))
    with running_mapper(processor) as info:
        host, port = split(info.address)
        assert host == "127.0.0.1"
        assert listening_hosts(port) == {"127.0.0.1"}


def test_a_worker_given_its_hosts_address_binds_only_that(tmp_path: Path) -> None:
    processor = processor_for(tmp_path, ms.Tuning(heartbeat_seconds=0.1))
    with running_mapper(processor, host="127.0.0.2") as info:
        host, port = split(info.address)
        assert host == "127.0.0.2"
        assert listening_hosts(port) == {"127.0.0.2"}
        assert refused("127.0.0.1", port), "a wrong address must not reach the mapper"


def test_bind_host_opens_every_interface(tmp_path: Path) -> None:
    processor = processor_for(
        tmp_path, ms.Tuning(heartbeat_seconds=0.1, bind_host="0.0.0.0", plaintext_get_rows=True)
    )
    with running_mapper(processor) as info:
        host, port = split(info.address)
        assert host == "127.0.0.1"
        assert listening_hosts(port) in ({"0.0.0.0"}, {"::"}, {"0.0.0.0", "::"})


PLAINTEXT_REFUSED = r"plaintext on '0\.0\.0\.0'.*mutual TLS.*plaintext_get_rows=True"


def test_plaintext_beyond_loopback_is_refused_by_every_runner(tmp_path: Path) -> None:
    processor = processor_for(tmp_path, ms.Tuning(bind_host="0.0.0.0"))
    stopped = threading.Event()
    stopped.set()  # a worker that started would return at once
    with pytest.raises(ConfigurationError, match=PLAINTEXT_REFUSED):
        run_worker(processor, "mapper", 0, stopped)
    runner = LocalRunner(processor)
    try:
        with pytest.raises(ConfigurationError, match=PLAINTEXT_REFUSED):
            runner.start()
        assert not runner.pids(), "no worker may start"
    finally:
        runner.stop()


def test_an_address_of_no_local_interface_is_a_configuration_error(tmp_path: Path) -> None:
    # 203.0.113.0/24 is reserved for documentation: no interface has it, nothing is sent.
    processor = processor_for(
        tmp_path, ms.Tuning(advertise_host="203.0.113.9", plaintext_get_rows=True)
    )
    with pytest.raises(ConfigurationError, match=r"cannot listen on '203\.0\.113\.9'.*bind_host"):
        run_worker(processor, "mapper", 0, threading.Event())


def test_tuning_overrides_the_hosts_address() -> None:
    assert mapper_address(ms.Tuning(), "10.1.2.3") == MapperAddress("10.1.2.3", "10.1.2.3")
    assert mapper_address(ms.Tuning()) == MapperAddress("127.0.0.1", "127.0.0.1")
    assert mapper_address(ms.Tuning(advertise_host="node-7"), "10.1.2.3") == MapperAddress(
        "node-7", "node-7"
    )
    assert mapper_address(ms.Tuning(bind_host="::"), "fd00::5") == MapperAddress("::", "fd00::5")
    assert MapperAddress("::", "fd00::5").endpoint(50051) == "[fd00::5]:50051"
    assert host_port("10.1.2.3", 1) == "10.1.2.3:1"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("10.0.0.1", False),
        ("node-7", False),
        ("::", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
