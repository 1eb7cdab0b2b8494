"""Names a package loads on first use (PEP 562), so importing it stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["loader"]


def loader(package: str, names: Mapping[str, str | None]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each of ``names`` is imported from
    the module it maps to (None: the name is a submodule of ``package``)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = names[name]
        if module is None:
            return importlib.import_module(f"{package}.{name}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
