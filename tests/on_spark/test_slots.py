"""Slot counting and the speculation check, without a Spark session."""

from __future__ import annotations

import os
from typing import Any

import pytest
from millstream.exceptions import ConfigurationError
from millstream.spark.launch import _check_speculation
from millstream.spark.slots import Slots, slots_of, wait_for_slots


@pytest.mark.parametrize(
    ("master", "conf", "expected"),
    [
        ("local", {}, 1),
        ("local[3]", {}, 3),
        ("local[4,3]", {}, 4),
        ("local[ 4 , 3 ]", {}, 4),
        ("local[*]", {}, os.cpu_count() or 1),
        ("local[*,2]", {}, os.cpu_count() or 1),
        ("local[8]", {"spark.task.cpus": "2"}, 4),
        ("local-cluster[2,3,1024]", {}, 6),
        ("spark://h:7077", {"spark.executor.cores": "4"}, 12),
        ("yarn", {}, 7),
        (
            "yarn",
            {
                "spark.executor.cores": "2",
                "spark.dynamicAllocation.enabled": "true",
                "spark.dynamicAllocation.maxExecutors": "10",
            },
            20,
        ),
    ],
)
def test_slots_of(master: str, conf: dict[str, str], expected: int) -> None:
    assert slots_of(master, conf, default_parallelism=7, executors=3).count == expected


class _FakeContext:
    def __init__(self, conf: dict[str, str]) -> None:
        self._conf = conf

    def getConf(self) -> Any:
        return self._conf


def test_speculation_refused_unless_allowed() -> None:
    with pytest.raises(ConfigurationError, match=r"spark\.speculation"):
        _check_speculation(_FakeContext({"spark.speculation": "true"}), allow=False)
    _check_speculation(_FakeContext({"spark.speculation": "true"}), allow=True)
    _check_speculation(_FakeContext({}), allow=False)


class _Cluster:
    """A context on a cluster master whose executors register as a fake clock advances."""

    master = "spark://127.0.0.1:7077"

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.now = 0.0

    def slots(self, _sc: Any) -> Slots:
        count = self.counts[min(int(self.now), len(self.counts) - 1)]
        executors = count // 2
        plural = "" if executors == 1 else "s"
        return Slots(count, f"{executors} executor{plural} registered with {count} cores")

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waits_for_executors_to_register() -> None:
    cluster = _Cluster([0, 2, 2, 4, 5])
    lines: list[str] = []
    found = wait_for_slots(
        cluster,
        5,
        "2 mappers + 3 reducers",
        timeout=30,
        progress=lines.append,
        slots=cluster.slots,
        clock=lambda: cluster.now,
        sleep=cluster.sleep,
    )
    assert found.count == 5
    assert cluster.now == 4
    assert lines[0].startswith("millstream: waiting up to 30 s for 5 concurrent task slots")
    assert "0 so far" in lines[0]
    assert any("4 of 5 task slots" in line for line in lines)
    assert lines[-1].startswith("millstream: 5 task slots ready")


def test_gives_up_after_the_wait_naming_what_is_missing() -> None:
    cluster = _Cluster([0, 3])
    lines: list[str] = []
    with pytest.raises(
        ConfigurationError,
        match=r"needs 5 concurrent task slots \(2 mappers \+ 3 reducers\) but after waiting "
        r"10 s for executors to register the application has 3: 1 executor registered "
        r"with 3 cores; 2 missing.*slot_wait",
    ):
        wait_for_slots(
            cluster,
            5,
            "2 mappers + 3 reducers",
            timeout=10,
            progress=lines.append,
            slots=cluster.slots,
            clock=lambda: cluster.now,
            sleep=cluster.sleep,
        )
    assert cluster.now == 10
    assert len(lines) == 2


def test_a_local_master_fails_at_once() -> None:
    cluster = _Cluster([3])
    cluster.master = "local[3]"
    with pytest.raises(ConfigurationError, match=r"needs 4 .* has 3"):
        wait_for_slots(
            cluster, 4, timeout=30, slots=cluster.slots, clock=lambda: 0.0, sleep=cluster.sleep
        )
    assert cluster.now == 0


def test_registered_executor_cores_count_on_a_cluster() -> None:
    slots = slots_of("spark://h:7077", {}, default_parallelism=2, executors=1, registered_cores=3)
    assert (slots.count, slots.how) == (3, "1 executor registered with 3 cores")
    assert slots_of("spark://h:7077", {}, 2, executors=0, registered_cores=0).count == 0
