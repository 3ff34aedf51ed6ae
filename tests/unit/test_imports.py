"""``import millstream`` is cheap, so that a runner can start its fork server first."""

from __future__ import annotations

import subprocess
import sys

import millstream
import pytest

HEAVY = ("pyarrow", "grpc", "numpy", "millstream.processor", "millstream.workers")


def _modules_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "statement",
    ["import millstream", "from millstream.runner.forkserver import start_fork_server"],
)
def test_light_imports_load_no_heavy_module(statement: str) -> None:
    loaded = _modules_after(statement)
    assert not loaded & set(HEAVY), f"{statement!r} loaded {sorted(loaded & set(HEAVY))}"


def test_public_names_resolve_on_first_use() -> None:
    loaded = _modules_after("import millstream as ms\nms.Processor")
    assert "millstream.processor" in loaded
    for name in millstream.__all__:
        assert getattr(millstream, name) is not None
    from millstream import Processor, Reducer
    from millstream.api import Reducer as ApiReducer
    from millstream.processor import Processor as RealProcessor

    assert Processor is RealProcessor
    assert Reducer is ApiReducer
    assert set(millstream.__all__) <= set(dir(millstream))


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Procesor'"):
        millstream.Procesor  # noqa: B018
