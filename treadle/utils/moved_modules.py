"""Old module paths: a module moved to another package answers at its old
name with the new module itself (one module object, so ``isinstance`` and
monkeypatching see the same classes), with a ``DeprecationWarning`` naming
the path to import and the version the old one goes in; one that left the
package is refused in one line saying where it went. Which names, and until
when: the rows of :mod:`treadle.utils.deprecations`.

The new module stays its own: its ``__spec__`` is its own (so that
``importlib.reload`` runs it again), and ``python -m`` of an old path says
in one line what to run instead.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Dict, Optional, Sequence

from .deprecations import GONE, Deprecated, moved_modules

__all__ = ["keep_old_paths"]


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, moved: Dict[str, Deprecated], gone: Dict[str, str]) -> None:
        self.moved, self.gone = moved, gone
        # The new module's own spec, by old name, between create_module and exec_module.
        self._own_specs: Dict[str, Optional[importlib.machinery.ModuleSpec]] = {}

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname in self.gone:
            raise ModuleNotFoundError(f"{fullname} is no longer a module of treadle: {self.gone[fullname]}",
                                      name=fullname)
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in self.moved else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.moved[spec.name].new)
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """The new module ran when it was imported: it gets its own spec
        back (the import system gave it the old name's) and the importer a
        ``DeprecationWarning``."""
        old = module.__spec__.name if module.__spec__ is not None else module.__name__
        module.__spec__ = self._own_specs.pop(old, None) or module.__spec__
        # stacklevel 2: the warnings module skips the import system's frames, to the importing line.
        warnings.warn(self.moved[old].message(), DeprecationWarning, stacklevel=2)

    def get_code(self, fullname: str) -> None:
        """``python -m`` of an old path (runpy asks for the module's code): refused in one line."""
        row = self.moved[fullname]
        raise ImportError(f"{fullname} moved to {row.new} and is removed in treadle {row.removed_in}: "
                          f"run python -m {row.new} instead")


def keep_old_paths(package: str) -> None:
    """Makes each module that lived in ``package`` (its rows of
    :data:`~treadle.utils.deprecations.DEPRECATED`) import at its old name
    as the new module, with its ``DeprecationWarning``, and each module of
    :data:`~treadle.utils.deprecations.GONE` there refused in one line.
    Called by the package's ``__init__``, which Python runs before looking
    up any of its modules."""
    gone = {old: where for old, where in GONE.items() if old.rpartition(".")[0] == package}
    sys.meta_path.append(_MovedModules(moved_modules(package), gone))
