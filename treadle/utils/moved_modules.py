"""Old module paths that still import: a module moved to another package
answers at its old name with the new module itself (one module object, so
``isinstance`` and monkeypatching see the same classes)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Dict, Optional, Sequence

__all__ = ["keep_old_paths"]


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, moved: Dict[str, str]) -> None:
        self.moved = moved

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in self.moved else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.moved[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """The new module ran when it was imported."""


def keep_old_paths(moved: Dict[str, str]) -> None:
    """Makes each old module name of ``moved`` (old -> new) import the new module."""
    sys.meta_path.append(_MovedModules(moved))
