"""The API reference, built from the code: one directive per package page,
and cross-references resolved by Python's own names.

``.. treadle-api:: treadle.engine`` documents each name of the package's
``__all__`` at the name a user imports (``treadle.engine.Trainer``), with its
signature and docstring: classes with their public members, functions, and
constants and type aliases with the ``#:`` comment where they are defined.
The pages hold no list of names, so a name added to an ``__all__`` is in the
reference at the next build; ``tests/docs/test_api_reference.py`` checks that
each has a docstring.

Cross-references in docstrings name objects as the code does: ``HookBase``
in a module that imports it, ``treadle.engine.train_loop.TrainerBase`` where it
is defined, ``treadle.engine.Trainer`` where it is exported. Where Sphinx's
own lookup finds no target, :func:`resolve_by_import` imports the name (in the
module, then the class, whose docstring holds the reference) and links to the
place the reference documents that object; a name that imports nothing, or
whose object is documented nowhere, stays a broken reference (an error
under ``-n -W``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from typing import Any, Dict, Iterator, List, Optional, Tuple, TypeVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: The packages of the reference, each a page docs/api/<name>.md; utils has no
#: package ``__all__``: its public modules are listed instead.
PACKAGES = [
    "treadle.engine",
    "treadle.hooks",
    "treadle.events",
    "treadle.checkpoint",
    "treadle.config",
    "treadle.data",
    "treadle.evaluation",
    "treadle.solver",
    "treadle.models",
]
#: The modules of treadle.utils a user calls (the others are the package's plumbing).
UTILS_MODULES = [
    "treadle.utils.comm",
    "treadle.utils.logger",
    "treadle.utils.file_io",
    "treadle.utils.env",
    "treadle.utils.device",
    "treadle.utils.rng",
    "treadle.utils.atomic",
    "treadle.utils.run_folder",
]


def public_names(module_name: str) -> List[str]:
    """The names ``module_name``'s ``__all__`` exports (an error if it has none)."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        raise ValueError(f"{module_name} has no __all__: the reference documents the names of an __all__")
    return list(names)


def kind_of(value: Any) -> str:
    """How the reference documents ``value``: ``module``, ``class``, ``function`` or ``data``."""
    if isinstance(value, types.ModuleType):
        return "module"
    if inspect.isclass(value):
        return "class"
    if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.ismethod(value):
        return "function"
    return "data"


def data_doc(module_name: str, name: str) -> Optional[List[str]]:
    """The ``#:`` comment (or string after it) of the constant ``name`` that
    ``module_name`` exports, read where it is assigned: the package, or the
    treadle module that defines a global of that name and that value."""
    value = getattr(importlib.import_module(module_name), name)
    candidates = [module_name] + sorted(m for m in sys.modules if m.startswith("treadle."))
    for candidate in candidates:
        module = sys.modules.get(candidate)
        if module is None or vars(module).get(name, object()) is not value:
            continue
        try:
            docs = ModuleAnalyzer.for_module(candidate).find_attr_docs()
        except Exception:  # noqa: BLE001 - a module without source: look elsewhere
            continue
        lines = docs.get(("", name))
        if lines and any(line.strip() for line in lines):
            return [line for line in lines]
    return None


def docstring_of(module_name: str, name: str) -> Optional[str]:
    """The documentation the reference shows for ``module_name.name``, or None."""
    value = getattr(importlib.import_module(module_name), name)
    kind = kind_of(value)
    if kind == "data":
        lines = data_doc(module_name, name)
        return "\n".join(lines).strip() or None if lines else None
    return (inspect.getdoc(value) or "").strip() or None


def entries(module_name: str) -> Iterator[Tuple[str, str]]:
    """``(name, kind)`` for each name of ``module_name``'s ``__all__``."""
    module = importlib.import_module(module_name)
    for name in public_names(module_name):
        yield name, kind_of(getattr(module, name))


def owning_package(value: Any) -> Optional[str]:
    """The page (package or utils module) that defines ``value``, or None for data."""
    module = getattr(value, "__module__", None)
    if not isinstance(module, str) or isinstance(value, types.ModuleType):
        return None
    for candidate in sorted(PACKAGES + UTILS_MODULES, key=len, reverse=True):
        if module == candidate or module.startswith(candidate + "."):
            return candidate
    return None


def reference_lines(module_name: str) -> List[str]:
    """The reStructuredText that documents ``module_name``'s ``__all__``."""
    lines = [f".. automodule:: {module_name}", "", f".. currentmodule:: {module_name}", ""]
    module = importlib.import_module(module_name)
    for name, kind in entries(module_name):
        value = getattr(module, name)
        owner = owning_package(value)
        # An object two packages export is a target on its own package's page only.
        no_index = ["   :no-index:"] if owner is not None and owner != module_name else []
        if kind == "module":
            lines += [f".. py:data:: {name}", "",
                      f"   The :mod:`{value.__name__}` package, also importable from here.", ""]
        elif kind == "class":
            lines += [f".. autoclass:: {name}", "   :members:", "   :show-inheritance:"] + no_index + [""]
        elif kind == "function":
            lines += [f".. autofunction:: {name}"] + no_index + [""]
        else:
            lines += data_lines(module_name, name)
    return lines


def data_lines(module_name: str, name: str) -> List[str]:
    """A constant (or type alias), with its ``#:`` comment: a ``py:data`` entry."""
    doc = data_doc(module_name, name) or []
    return [f".. py:data:: {name}", f"   :module: {module_name}", ""] + [f"   {line}" if line.strip() else "" for line in doc] + [""]


def submodules() -> List[str]:
    """Every module of treadle below the packages of the reference, in order."""
    import pkgutil

    import treadle

    names = []
    for info in pkgutil.walk_packages(treadle.__path__, "treadle."):
        if info.name in PACKAGES or info.name.split(".")[-1].startswith("_") or ".model_zoo.configs" in info.name:
            continue
        names.append(info.name)
    return sorted(names)


def exported_objects() -> Dict[int, str]:
    """``id(object) -> name`` of every object a page of the reference documents."""
    found: Dict[int, str] = {}
    for module_name in PACKAGES + UTILS_MODULES:
        module = importlib.import_module(module_name)
        for name, kind in entries(module_name):
            if kind in ("class", "function"):
                found.setdefault(id(getattr(module, name)), f"{module_name}.{name}")
    return found


def module_lines() -> List[str]:
    """The reStructuredText of the modules page: each module's docstring, and
    the names of its ``__all__`` that no package page documents."""
    exported = exported_objects()
    lines: List[str] = []
    for module_name in submodules():
        title = f"``{module_name}``"
        lines += [title, "-" * len(title), ""]
        if module_name in UTILS_MODULES:
            lines += [f"Documented on :doc:`the utils page <utils>`: :mod:`{module_name}`.", ""]
            continue
        lines += [f".. automodule:: {module_name}", ""]
        if module_name.rsplit(".", 1)[0] in PACKAGES and hasattr(
            importlib.import_module(module_name.rsplit(".", 1)[0]), module_name.rsplit(".", 1)[1]
        ) and not isinstance(getattr(importlib.import_module(module_name.rsplit(".", 1)[0]), module_name.rsplit(".", 1)[1]), types.ModuleType):
            # A module named as the function its package exports (treadle.config.instantiate):
            # the name links to the function.
            lines[-2:] = [f".. automodule:: {module_name}", "   :no-index:", ""]
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            kind = kind_of(value)
            if id(value) in exported or (kind != "data" and getattr(value, "__module__", module_name) != module_name):
                continue  # on a package page, or defined elsewhere
            if kind == "class":
                lines += [f".. autoclass:: {module_name}.{name}", "   :members:", "   :show-inheritance:", ""]
            elif kind == "function":
                lines += [f".. autofunction:: {module_name}.{name}", ""]
            elif kind == "data" and not isinstance(value, TypeVar):
                lines += data_lines(module_name, name)
        lines.append("")
    return lines


class TreadleModules(SphinxDirective):
    """``.. treadle-modules::``: every module of treadle, for the maintainer."""

    has_content = False

    def run(self) -> List[nodes.Node]:
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(module_lines(), source="<treadle-modules>"), container)
        return container.children


class TreadleAPI(SphinxDirective):
    """``.. treadle-api:: PACKAGE``: the package's ``__all__``, documented."""

    required_arguments = 1
    has_content = False
    option_spec = {"heading": directives.unchanged}

    def run(self) -> List[nodes.Node]:
        module_name = self.arguments[0]
        self.env.note_dependency(importlib.import_module(module_name).__file__)
        lines = reference_lines(module_name)
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source=f"<treadle-api {module_name}>"), container)
        return container.children


def _import(path: str) -> Any:
    """The object a dotted ``path`` names, or raises: an attribute of its
    parent first (``treadle.engine.launch`` is the function the package
    exports, not the module of that name), else a module."""
    if "." in path:
        parent, name = path.rsplit(".", 1)
        try:
            return getattr(_import(parent), name)
        except (ImportError, AttributeError):
            pass
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)


def _documented_name(app: Sphinx, obj: Any, attr_path: Tuple[str, ...] = ()) -> Optional[str]:
    """Where the reference documents ``obj`` (one of the objects it lists), or None."""
    objects = app.env.get_domain("py").objects  # type: ignore[attr-defined]
    index = getattr(app.env, "treadle_api_index", None)
    if index is None:
        index = {}
        for full_name, entry in objects.items():
            if entry.objtype not in ("class", "function", "exception", "data", "module", "method", "attribute", "property"):
                continue
            try:
                value = _import(full_name)
            except Exception:  # noqa: BLE001 - not importable: documented by hand
                continue
            if isinstance(value, (int, float, str, bool, type(None))):
                continue  # equal constants are not the same object
            index.setdefault(id(value), full_name)
        app.env.treadle_api_index = index  # type: ignore[attr-defined]
    found = index.get(id(obj))
    if found is None and isinstance(obj, (int, float, str, bool, tuple)):
        # A constant: the documented data of the same name and value.
        name = attr_path[-1] if attr_path else None
        for full_name, entry in objects.items():
            if entry.objtype == "data" and (name is None or full_name.endswith("." + name)):
                try:
                    if _import(full_name) == obj:
                        return full_name
                except Exception:  # noqa: BLE001
                    continue
    if found and attr_path:
        found = ".".join((found,) + attr_path)
        return found if found in objects else None
    return found


def _is_constant(obj: Any) -> bool:
    return isinstance(obj, (int, float, str, bool, tuple))


def _defined_in_treadle(obj: Any, path: str) -> bool:
    """Whether ``obj`` (found at ``path``) is treadle's own: a constant found
    in treadle, or an object whose module is treadle's."""
    if _is_constant(obj) or obj is None:
        return path.startswith("treadle.")
    module = getattr(obj, "__module__", None) if not isinstance(obj, types.ModuleType) else obj.__name__
    if not isinstance(module, str):
        return path.startswith("treadle.")
    return module == "treadle" or module.startswith("treadle.")


def _docstring_owner(node: Any) -> Any:
    """The object whose docstring holds ``node`` (autodoc's ``docstring of NAME``), or None."""
    import re

    parent = node
    while parent is not None and not getattr(parent, "source", None):
        parent = parent.parent
    match = re.search(r"docstring of ([\w.]+)$", getattr(parent, "source", "") or "")
    if not match:
        return None
    try:
        return _import(match.group(1))
    except Exception:  # noqa: BLE001 - not importable: no scope from it
        return None


def _owner_class(obj: Any) -> Any:
    """The class that defines the function or property ``obj``, or None."""
    function = getattr(obj, "fget", obj)
    qualname = getattr(function, "__qualname__", "")
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    if module is None or "." not in qualname:
        return None
    owner: Any = module
    for part in qualname.split(".")[:-1]:
        owner = getattr(owner, part, None)
    return owner if inspect.isclass(owner) else None


def resolve_by_import(app: Sphinx, env: Any, node: Any, contnode: Any) -> Optional[nodes.Node]:
    """Resolve a Python cross-reference that Sphinx's lookup missed by importing its target."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    module, klass = node.get("py:module"), node.get("py:class")
    scopes = []
    if module and klass:
        scopes.append(f"{module}.{klass}.")
    if module:
        scopes.append(f"{module}.")
    # A docstring shown under the package's name (``treadle.engine.Trainer``)
    # names things as its own module does: that module, and its class.
    written_in = _docstring_owner(node)
    if written_in is not None:
        owner = written_in
        while owner is not None and not isinstance(owner, types.ModuleType) and not inspect.isclass(owner):
            owner = getattr(owner, "__objclass__", None) or _owner_class(owner)
        source_module = getattr(written_in, "__module__", None)
        if inspect.isclass(owner):
            scopes.insert(0, f"{owner.__module__}.{owner.__qualname__}.")
        if isinstance(source_module, str):
            scopes.insert(1 if inspect.isclass(owner) else 0, f"{source_module}.")
    scopes.append("")
    for scope in scopes:
        path = scope + target
        try:
            obj = _import(path)
        except Exception:  # noqa: BLE001 - not this scope
            continue
        private = any(part.startswith("_") and not part.startswith("__") for part in path.split("."))
        if isinstance(obj, TypeVar) or private or not _defined_in_treadle(obj, path):
            # A type variable or a private name (no page of their own: a
            # signature may name them), or another package's
            # object reached through treadle (``LRMultiplier.get_last_lr`` is
            # torch's): shown as code, as conf.py's nitpick_ignore_regex shows
            # the names of other packages.
            return contnode
        documented = _documented_name(app, obj, (path.rsplit(".", 1)[-1],) if _is_constant(obj) else ())
        if documented is None and "." in path:
            # A method or attribute: its owner documented, the member under it.
            owner_path, member = path.rsplit(".", 1)
            try:
                owner = _import(owner_path)
            except Exception:  # noqa: BLE001
                owner = None
            if owner is not None and inspect.isclass(owner):
                for base in inspect.getmro(owner):
                    # An instance attribute is in no class's vars: its
                    # ``#:`` comment documents it under the class.
                    documented = _documented_name(app, base, (member,))
                    if documented:
                        break
        if documented is None:
            continue
        py = env.get_domain("py")
        resolved = py.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], documented, node, contnode)
        if resolved is None:
            # The role names another kind (``:func:`` for a class): link it anyway.
            found = py.resolve_any_xref(env, node["refdoc"], app.builder, documented, node, contnode)
            resolved = found[0][1] if found else None
        if resolved is not None:
            return resolved
    return None


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_directive("treadle-api", TreadleAPI)
    app.add_directive("treadle-modules", TreadleModules)
    app.connect("missing-reference", resolve_by_import, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
