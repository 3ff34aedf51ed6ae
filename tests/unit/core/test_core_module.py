"""The native module's shape: frozen classes, exception hierarchy, the stub contract."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import millstream.exceptions as exceptions
import pytest
from millstream import _core

RUST = Path(__file__).parents[3] / "rust"


def test_every_pyclass_is_frozen() -> None:
    sources = list(RUST.glob("**/src/**/*.rs"))
    assert sources
    declarations = [
        (path.name, m.group(0))
        for path in sources
        for m in re.finditer(r"#\[pyclass(\([^]]*\))?\]", path.read_text())
    ]
    assert declarations, "no pyclass found"
    assert [d for d in declarations if "frozen" not in d[1]] == []


def test_window_rejects_new_attributes() -> None:
    w = _core.Window(1, 1)
    with pytest.raises(AttributeError):
        w.snapshot().num_reducers = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        w.local_state = None  # type: ignore[assignment,method-assign]
    with pytest.raises(AttributeError):
        w.anything = 1  # type: ignore[attr-defined]


def test_exception_hierarchy_is_reexported_unchanged() -> None:
    assert exceptions.MillstreamError is _core.MillstreamError
    assert issubclass(_core.WindowError, _core.MillstreamError)
    for name in ("MemoryLimitError", "CommittedIndexError", "SchemaMismatchError"):
        cls = getattr(_core, name)
        assert getattr(exceptions, name) is cls
        assert issubclass(cls, _core.WindowError)
        assert cls.__module__ == "millstream._core"


def test_stub_names_match_the_module() -> None:
    stub = (Path(_core.__file__).parent / "_core.pyi").read_text()
    declared = set(re.findall(r"^(?:def|class) (\w+)", stub, re.M))
    declared |= set(re.findall(r"^([A-Za-z]\w*): ", stub, re.M))  # module constants
    public = {n for n in dir(_core) if not n.startswith("_")}
    assert declared == public


@pytest.mark.slow
def test_stubs_pass_stubtest() -> None:
    root = Path(__file__).parents[3]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "millstream._core",
            "--mypy-config-file",
            "pyproject.toml",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
