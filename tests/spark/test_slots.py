"""Slot counting and the speculation check, without a Spark session."""

from __future__ import annotations

import os
from typing import Any

import pytest
from millstream.exceptions import ConfigurationError
from millstream.spark.runner import _check_speculation
from millstream.spark.slots import slots_of


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
