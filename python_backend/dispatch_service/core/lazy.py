"""Lazy re-exports for package `__init__` files (PEP 562 module `__getattr__`).

A package re-exports its main names without importing its modules: `import
dispatch_service.routing.settings` must not load the routing engine, and the launcher must
not load SciPy or ONNX Runtime, just because a package `__init__` names them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "lazy_exports",
]


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: ``exports`` maps a submodule to its names.

    A name is imported from its submodule on first access; a submodule that is not listed
    still imports as usual (``from package import module``).
    """
    home = {name: module for module, names in exports.items() for name in names}

    def get_attribute(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def names() -> list[str]:
        return sorted(home)

    return get_attribute, names
