"""Fail when a module outgrows its room: one concept per module keeps modules small.

Limits: 600 lines for a module of the package, the Rust crates or the benchmarks
(``python/``, ``rust/``, ``bench/``); 800 for a test module (under ``tests/``, or a
``test_*.py`` / ``conftest.py`` / ``tests/*.rs`` file under the other folders). Generated
gRPC code is not counted. Run from the repository's root (``make lint`` does); prints each
file over its limit with its line count and exits 1, or exits 0.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

MODULE_LIMIT = 600
TEST_LIMIT = 800
ROOTS = ("python", "rust", "bench", "tests")
SUFFIXES = (".py", ".rs")
SKIPPED_PARTS = {"target", ".venv", "__pycache__", "node_modules"}


def is_generated(path: Path) -> bool:
    """gRPC's generated modules (``*_pb2.py``, ``*_pb2_grpc.py``)."""
    return path.stem.endswith(("_pb2", "_pb2_grpc"))


def is_test(path: Path) -> bool:
    """A test module: anything under ``tests/``, or a test file elsewhere."""
    return "tests" in path.parts or path.name.startswith("test_") or path.name == "conftest.py"


def modules(root: Path) -> Iterator[Path]:
    """The source files under the checked folders, in order."""
    for folder in ROOTS:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            relative = path.relative_to(root)
            if (
                path.suffix in SUFFIXES
                and path.is_file()
                and not SKIPPED_PARTS & set(relative.parts)
                and not is_generated(path)
            ):
                yield relative


def oversized(root: Path) -> list[tuple[Path, int, int]]:
    """Each file over its limit: (path, lines, limit)."""
    found = []
    for path in modules(root):
        with (root / path).open("rb") as f:
            lines = sum(1 for _ in f)
        limit = TEST_LIMIT if is_test(path) else MODULE_LIMIT
        if lines > limit:
            found.append((path, lines, limit))
    return found


def main() -> int:
    found = oversized(Path.cwd())
    for path, lines, limit in found:
        kind = "test module" if limit == TEST_LIMIT else "module"
        print(f"{path}: {lines} lines, over the {limit}-line limit of a {kind}")
    if found:
        print(
            f"{len(found)} file(s) too long: split each by concept, one concept per module",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
