"""Package attributes imported on first use (PEP 562), so `gpucluster COMMAND` loads only what that
command needs: every subcommand's package is imported to register its arguments."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable


def lazy_exports(package: str, exports: dict[str, Iterable[str]]) -> tuple[list[str], Callable[[str], object]]:
    """(__all__, __getattr__) for `package`, from {submodule: names it provides}; a name's submodule is
    imported the first time the name is asked for."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)
    return sorted(where), __getattr__
