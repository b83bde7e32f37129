"""Between Python objects and the dotted import paths that name them in configs.

``locate("torch.nn.Linear")`` imports and returns the object; ``import_path(obj)``
finds the shortest dotted path that ``locate`` maps back to the very same
object, or ``None`` when there is none (lambdas, local classes, instances).
"""

from __future__ import annotations

import builtins
import difflib
import enum
import importlib
import types
from typing import Any, Optional

from .errors import ConfigError

__all__ = ["locate", "import_path"]


class NotLocatable(Exception):
    """Internal: why a dotted path does not resolve (the reason is the message)."""


def _import_module(name: str) -> Optional[types.ModuleType]:
    """Imports ``name``; ``None`` when that module itself does not exist.

    A module that exists but fails to import (a missing dependency inside it, an
    error at import time) is reported, not mistaken for "no such module".
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise NotLocatable(f"importing module '{name}' failed: {type(e).__name__}: {e}") from e
    except Exception as e:
        raise NotLocatable(f"importing module '{name}' failed: {type(e).__name__}: {e}") from e


def _close_names(name: str, obj: Any) -> str:
    matches = difflib.get_close_matches(name, [n for n in dir(obj) if not n.startswith("__")], n=3)
    return f" (did you mean {', '.join(repr(m) for m in matches)}?)" if matches else ""


def resolve_path(path: str) -> Any:
    parts = path.split(".")
    if not path or any(not part or part != part.strip() for part in parts):
        raise NotLocatable("it is not a dotted import path like 'package.module.name'")
    obj: Any = _import_module(parts[0])
    if obj is None:
        # A bare name like "dict" or "int" names a builtin, as it would in Python code.
        if len(parts) == 1 and hasattr(builtins, parts[0]):
            return getattr(builtins, parts[0])
        raise NotLocatable(f"no module named '{parts[0]}'")
    for i in range(1, len(parts)):
        part = parts[i]
        try:
            obj = getattr(obj, part)
            continue
        except AttributeError:
            pass
        # Submodules are only attributes of their package once imported.
        if isinstance(obj, types.ModuleType):
            submodule = _import_module(".".join(parts[: i + 1]))
            if submodule is not None:
                obj = submodule
                continue
        owner = ".".join(parts[:i])
        kind = "module" if isinstance(obj, types.ModuleType) else type(obj).__name__
        raise NotLocatable(f"{kind} '{owner}' has no attribute '{part}'{_close_names(part, obj)}")
    return obj


def locate(path: str) -> Any:
    """Imports and returns the object named by a dotted path.

    ``path`` is ``"package.module.attribute[.attribute...]"`` (submodules are
    imported as needed) or the bare name of a builtin (``"dict"``).

    Raises:
        ConfigError: naming ``path`` and why it does not resolve (no such module,
            a missing attribute with close matches, a module that fails to import).
    """
    if not isinstance(path, str):
        raise ConfigError(
            f"Cannot locate {path!r}: an import path must be a string, got {type(path).__name__}"
        )
    try:
        return resolve_path(path)
    except NotLocatable as e:
        raise ConfigError(f"Cannot locate '{path}': {e}") from e.__cause__


def _resolves_to(path: str, obj: Any) -> bool:
    try:
        return resolve_path(path) is obj
    except NotLocatable:
        return False


def import_path(obj: Any) -> Optional[str]:
    """The shortest dotted path that :func:`locate` maps back to ``obj`` itself.

    ``torch.nn.modules.linear.Linear`` becomes ``"torch.nn.Linear"`` because the
    shorter path names the same class. Enum members are named through their
    class (``"pkg.Color.RED"``). Returns ``None`` for anything that cannot be
    imported back: lambdas, functions and classes defined inside functions or
    inside config files, and ordinary instances.
    """
    if isinstance(obj, enum.Enum):
        owner = import_path(type(obj))
        return f"{owner}.{obj.name}" if owner and _resolves_to(f"{owner}.{obj.name}", obj) else None
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    # Public paths are shorter prefixes of the defining module ("torch.nn" rather
    # than "torch.nn.modules.linear"); try the shortest first.
    module_parts = module.split(".")
    names = [qualname]
    # Some C functions carry the qualname of an internal class
    # (torch.relu is "_VariableFunctionsClass.relu") but live under their plain name.
    name = getattr(obj, "__name__", None)
    if isinstance(name, str) and name != qualname:
        names.append(name)
    for attr in names:
        for k in range(1, len(module_parts) + 1):
            candidate = ".".join(module_parts[:k] + [attr])
            if _resolves_to(candidate, obj):
                return candidate
    return None


def target_name(target: Any) -> str:
    """How a ``_target_`` is named in messages: its import path when it has one.

    Call it only when a message is built: finding the path may import modules.
    """
    if isinstance(target, str):
        return target
    return import_path(target) or getattr(target, "__qualname__", None) or repr(target)
