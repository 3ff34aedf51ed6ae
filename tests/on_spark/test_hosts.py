"""What each executor advertises, and what a non-local master refuses, without a session."""

from __future__ import annotations

from typing import Any

import millstream as ms
import pytest
from millstream.exceptions import ConfigurationError
from millstream.spark.hosts import (
    Deployment,
    check_deployment,
    executor_host,
    is_local_master,
    master_on_loopback,
    route_address,
)

from examples.keyed_sum import PreAggregate, SumIntoStore

CLUSTER = "spark://10.0.0.1:7077"


class _TwoPartitions:
    """An input that is never read: these checks run before any worker starts."""

    num_partitions = 2

    def reader(self, partition: int) -> Any:
        raise AssertionError("not read")


def processor(
    store: str = "fdb://",
    advertise_host: str | None = None,
    *,
    plaintext: bool = True,
    bind_host: str | None = None,
) -> ms.Processor:
    return ms.Processor(
        mapper=PreAggregate,
        reducer=SumIntoStore,
        input=_TwoPartitions(),
        store=store,
        num_reducers=2,
        tuning=ms.Tuning(
            advertise_host=advertise_host, bind_host=bind_host, plaintext_get_rows=plaintext
        ),
    )


def deployment(master: str = CLUSTER, single_host: bool = False) -> Deployment:
    return Deployment(master, single_host, driver_host="127.0.0.1", driver_port=7078)


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[4,3]", True),
        ("local[*]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://127.0.0.1:7077", False),
        ("yarn", False),
        ("k8s://https://10.0.0.1:6443", False),
    ],
)
def test_is_local_master(master: str, local: bool) -> None:
    assert is_local_master(master) is local


def test_executor_host_prefers_sparks_own_settings() -> None:
    env = {"SPARK_LOCAL_IP": "10.0.0.7", "SPARK_EXECUTOR_POD_IP": "10.9.9.9"}
    assert executor_host("127.0.0.1", 7078, env) == ("10.0.0.7", "SPARK_LOCAL_IP")
    assert executor_host("127.0.0.1", 7078, {"SPARK_EXECUTOR_POD_IP": "10.9.9.9"}) == (
        "10.9.9.9",
        "SPARK_EXECUTOR_POD_IP",
    )
    host, source = executor_host("127.0.0.1", 7078, {})
    assert host == route_address("127.0.0.1", 7078) == "127.0.0.1"
    assert "routes to the driver" in source


def test_a_local_master_advertises_loopback() -> None:
    env = {"SPARK_LOCAL_IP": "10.0.0.7"}
    assert deployment("local[4,3]").worker_host(processor(), env) == "127.0.0.1"


def test_a_cluster_executor_advertises_its_own_address() -> None:
    assert deployment().worker_host(processor(), {"SPARK_LOCAL_IP": "10.0.0.7"}) == "10.0.0.7"
    assert deployment().worker_host(processor(advertise_host="node-7"), {}) == "node-7"


def test_a_loopback_executor_address_on_a_cluster_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"loopback address 127\.0\.0\.2.*SPARK_LOCAL_IP"):
        deployment().worker_host(processor(), {"SPARK_LOCAL_IP": "127.0.0.2"})
    with pytest.raises(ConfigurationError, match=r"routes to the driver.*single_host=True"):
        deployment().worker_host(processor(), {})
    stated = deployment(single_host=True)
    assert stated.worker_host(processor(), {"SPARK_LOCAL_IP": "127.0.0.2"}) == "127.0.0.2"


def test_sqlite_on_a_cluster_is_refused_unless_single_host() -> None:
    sqlite = processor("sqlite:///tmp/millstream-hosts-test.db")
    with pytest.raises(ConfigurationError, match=r"SQLite store .*\(fdb://\).*single_host=True"):
        check_deployment(sqlite, deployment())
    check_deployment(sqlite, deployment(single_host=True))
    check_deployment(sqlite, deployment("local[4,3]"))


def test_a_loopback_advertise_host_on_a_cluster_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"127\.0\.0\.1 \(Tuning\.advertise_host\)"):
        check_deployment(processor(advertise_host="127.0.0.1"), deployment())
    with pytest.raises(ConfigurationError, match="localhost"):
        check_deployment(processor(advertise_host="localhost"), deployment())
    check_deployment(processor(advertise_host="10.0.0.7"), deployment())
    check_deployment(processor(), deployment())
    check_deployment(processor(advertise_host="127.0.0.1"), deployment(single_host=True))


def test_plaintext_get_rows_on_a_cluster_is_refused_unless_accepted() -> None:
    with pytest.raises(ConfigurationError, match=r"plaintext.*mutual TLS.*plaintext_get_rows"):
        check_deployment(processor(plaintext=False), deployment())
    check_deployment(processor(plaintext=True), deployment())
    check_deployment(processor(plaintext=False), deployment(single_host=True))
    check_deployment(processor(plaintext=False), deployment("local[2]"))
    with_tls = Deployment(CLUSTER, False, "127.0.0.1", 7078, executor_tls=True)
    check_deployment(processor(plaintext=False), with_tls)


@pytest.mark.parametrize(
    "where",
    [deployment("local[2]"), deployment(single_host=True), deployment()],
    ids=["local master", "single host", "cluster"],
)
def test_plaintext_beyond_loopback_is_refused_on_every_master(where: Deployment) -> None:
    with pytest.raises(ConfigurationError, match=r"plaintext on '0\.0\.0\.0'.*plaintext_get_rows"):
        check_deployment(processor(bind_host="0.0.0.0", plaintext=False), where)
    check_deployment(processor(bind_host="0.0.0.0", plaintext=True), where)
    check_deployment(processor(bind_host="127.0.0.1", plaintext=False), where)
    tls = Deployment(where.master, where.single_host, "127.0.0.1", 7078, executor_tls=True)
    check_deployment(processor(bind_host="0.0.0.0", plaintext=False), tls)


@pytest.mark.parametrize(
    ("master", "here"),
    [
        ("spark://127.0.0.1:7077", True),
        ("spark://127.0.0.1:7077,127.0.0.2:7077", True),
        ("spark://[::1]:7077", True),
        ("spark://localhost:7077", True),
        ("spark://127.0.0.1:7077,10.0.0.2:7077", False),
        (CLUSTER, False),
        ("k8s://https://127.0.0.1:6443", False),  # a local API server schedules pods anywhere
        ("yarn", False),
    ],
)
def test_master_on_loopback(master: str, here: bool) -> None:
    assert master_on_loopback(master) is here


def test_a_standalone_master_on_loopback_takes_fdb_without_single_host() -> None:
    """Only this machine's workers register with a master on loopback: each executor
    advertises its own loopback address, and FoundationDB needs no single_host; SQLite
    still does (the store a deployment keeps when it grows past one machine)."""
    here = deployment("spark://127.0.0.1:7077")
    fdb = processor(plaintext=False)
    check_deployment(fdb, here)
    assert here.worker_host(fdb, {"SPARK_LOCAL_IP": "127.0.0.2"}) == "127.0.0.2"
    check_deployment(processor(advertise_host="127.0.0.1", plaintext=False), here)
    with pytest.raises(ConfigurationError, match=r"SQLite store .*single_host=True"):
        check_deployment(processor("sqlite:///tmp/millstream-hosts-test.db"), here)
