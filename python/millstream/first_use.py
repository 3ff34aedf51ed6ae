"""Names a package loads on first use (PEP 562), so that importing the package stays cheap:
a runner, the fork server and every worker start without modules their job never uses."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def on_first_use(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: each of ``names`` is
    imported from its module (the mapping's value) when first asked for, then kept in the
    package like a name imported at its top."""
    module = sys.modules[package]

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        setattr(module, name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(module), *names})

    return getattr_, dir_
