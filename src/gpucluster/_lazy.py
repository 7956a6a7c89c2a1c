"""Package attributes imported on first use (PEP 562), so `gpucluster COMMAND` loads only what that
command needs: every subcommand's package is imported to register its arguments."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module-level __getattr__ for `package` that imports exports[name] (a submodule) on first use."""
    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)
    return __getattr__
