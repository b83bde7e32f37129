"""Package attributes imported from their submodule when first read (PEP 562).

A package whose ``__init__`` would otherwise import a heavy dependency for a
few of its names (OmegaConf for the config entry points) exports those names
lazily, so that code using only its other names does not pay for the import.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Dict, List

from .deprecations import DEPRECATED, warn_deprecated

__all__ = ["lazy_exports"]


def lazy_exports(package: str, submodule_of: Dict[str, str]) -> None:
    """Make the names in ``submodule_of`` (public name -> the submodule,
    relative to ``package``, that defines it, or a module's absolute name
    for a module of another package) attributes of ``package`` that
    are imported when first read. Call it last in the package's ``__init__``::

        lazy_exports(__name__, {"instantiate": "instantiate"})

    A name with a row in :data:`~treadle.utils.deprecations.DEPRECATED`
    (``treadle.engine.Trainer``) warns at every read, naming what to import
    instead (it stays in ``dir()``, and out of the package's ``__all__``).

    A name may equal its submodule's name (``treadle.config.instantiate`` is
    both): importing the submodule makes Python set it on the package, which
    would hide the function behind the module; the package keeps the function.
    """
    module = sys.modules[package]
    old = {row.old.rpartition(".")[2] for row in DEPRECATED
           if row.kind == "attribute" and row.old.rpartition(".")[0] == package}

    class LazyExportsModule(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            submodule = submodule_of.get(name)
            if submodule is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            where = submodule if submodule.startswith("treadle.") else f".{submodule}"
            value = getattr(importlib.import_module(where, package), name)
            if name in old:
                # Not kept: every import of the old name warns, once (``from
                # package import name`` also probes it with hasattr from
                # importlib's own frames, which are not the user's line).
                if not sys._getframe(1).f_code.co_filename.startswith("<frozen importlib"):
                    warn_deprecated(f"{package}.{name}")
            else:
                vars(self)[name] = value  # later reads skip this method
            return value

        def __setattr__(self, name: str, value: Any) -> None:
            if (
                isinstance(value, types.ModuleType)
                and submodule_of.get(name) == name
                and value.__name__ == f"{package}.{name}"
            ):
                value = getattr(value, name)
            super().__setattr__(name, value)

        def __dir__(self) -> List[str]:
            return sorted(set(vars(self)) | set(submodule_of))

    module.__class__ = LazyExportsModule
