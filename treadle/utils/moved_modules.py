"""Old module paths: a module moved to another package answers at its old
name with the new module itself (one module object, so ``isinstance`` and
monkeypatching see the same classes); one that left the package is refused
in one line saying where it went."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Dict, Optional, Sequence

__all__ = ["keep_old_paths"]


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, moved: Dict[str, str], gone: Dict[str, str]) -> None:
        self.moved, self.gone = moved, gone

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname in self.gone:
            raise ModuleNotFoundError(f"{fullname} is no longer a module of treadle: {self.gone[fullname]}",
                                      name=fullname)
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in self.moved else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.moved[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """The new module ran when it was imported."""


def keep_old_paths(moved: Dict[str, str], gone: Optional[Dict[str, str]] = None) -> None:
    """Makes each old module name of ``moved`` (old -> new) import the new
    module, and each of ``gone`` (old -> where it went) refused in one line."""
    sys.meta_path.append(_MovedModules(moved, gone or {}))
