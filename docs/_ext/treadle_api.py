"""The API reference: autodoc's own directives, listed from the code's ``__all__``.

autodoc renders every entry (``autoclass`` and ``autofunction``, with the
class's ``__signature__`` and docstring). This extension does what it cannot
(docs/development.md, "The API reference"):

- ``.. treadle-api:: PACKAGE`` writes one entry per name of the package's
  ``__all__``, at the name users import (``treadle.engine.Trainer``). An
  object whose full entry is on another page (``treadle.engine.HookBase`` is
  :class:`treadle.hooks.HookBase`) gets a one-line entry linking there, where
  ``automodule :members:`` would render it again; a constant shows the ``#:``
  comment where it is assigned, which autodoc reads in the package only.
- ``.. treadle-api::`` without a package: the modules page, each module with
  the names of its ``__all__`` that no package page holds.
- :func:`resolve_by_import` links a docstring's reference as the code names
  it (``HookBase`` in a module that imports it) to the object's one entry.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
import sys
import types
from typing import Any, Dict, List, Optional, Tuple, TypeVar

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: The packages of the reference, each a page docs/api/<last part>.rst.
PACKAGES = ["treadle.engine", "treadle.hooks", "treadle.events", "treadle.checkpoint", "treadle.config",
            "treadle.data", "treadle.evaluation", "treadle.solver", "treadle.models", "treadle.model_zoo"]
#: The modules of treadle.utils a user calls, on docs/api/utils.rst (the package has no ``__all__``).
UTILS_MODULES = ["treadle.utils." + name for name in
                 ("comm", "logger", "file_io", "env", "device", "rng", "atomic", "run_folder")]
PAGES = PACKAGES + UTILS_MODULES
ROLES = {"class": "class", "function": "func", "data": "data"}


def public_names(module_name: str) -> List[str]:
    """The names ``module_name``'s ``__all__`` exports (an error if it has none)."""
    names = getattr(importlib.import_module(module_name), "__all__", None)
    if names is None:
        raise ValueError(f"{module_name} has no __all__: the reference documents the names of an __all__")
    return list(names)


def kind_of(value: Any) -> str:
    """How the reference documents ``value``: ``module``, ``class``, ``function`` or ``data``."""
    if isinstance(value, types.ModuleType):
        return "module"
    if inspect.isclass(value):
        return "class"
    return "function" if inspect.isroutine(value) else "data"


def data_doc(name: str, value: Any) -> Tuple[Optional[str], List[str]]:
    """The treadle module that assigns the constant ``name`` with a ``#:``
    comment (None: none does), and that comment's lines."""
    for module_name in sorted(m for m in sys.modules if m.startswith("treadle.")):
        if vars(sys.modules[module_name]).get(name, object()) is value:
            try:
                lines = ModuleAnalyzer.for_module(module_name).find_attr_docs().get(("", name))
            except Exception:  # noqa: BLE001 - a module without source: look elsewhere
                continue
            if lines and "".join(lines).strip():
                return module_name, list(lines)
    return None, []


def docstring_of(module_name: str, name: str) -> Optional[str]:
    """The text ``module_name.name``'s entry shows (a constant's ``#:`` comment), or None."""
    value = getattr(importlib.import_module(module_name), name)
    text = "\n".join(data_doc(name, value)[1]) if kind_of(value) == "data" else inspect.getdoc(value)
    return (text or "").strip() or None


@functools.lru_cache(maxsize=None)
def _exports() -> List[Tuple[str, str, Any]]:
    return [(page, name, getattr(importlib.import_module(page), name)) for page in PAGES for name in public_names(page)]


def full_entry(name: str, value: Any) -> Optional[Tuple[str, str]]:
    """``(page, name)`` of the one full entry of ``value``: on the page of the
    package that defines it, else the first that exports it (None: none does),
    under its own name (``LazyCall``, not ``L``)."""
    data = kind_of(value) == "data"
    found = [(page, n) for page, n, v in _exports() if v is value and (n == name or not data)]
    found.sort(key=lambda f: f[1] != getattr(value, "__name__", name))
    home = (data_doc(name, value)[0] or "") if data else getattr(value, "__module__", "")
    return next((f for f in sorted(found, key=lambda f: -len(f[0])) if (home + ".").startswith(f[0] + ".")),
                found[0] if found else None)


def entry_lines(module_name: str, name: str) -> List[str]:
    """The reStructuredText of ``module_name.name``'s entry."""
    value = getattr(importlib.import_module(module_name), name)
    kind, home = kind_of(value), full_entry(name, value)
    head = [f".. py:{'data' if kind == 'module' else kind}:: {name}", f"   :module: {module_name}"]
    if kind == "module":
        return head + ["", f"   The :mod:`{value.__name__}` package, also importable from here.", ""]
    if home is not None and home != (module_name, name):
        return head + ["   :no-index:", "",
                f"   Another name for :{ROLES[kind]}:`{'.'.join(home)}`, documented there.", ""]
    if kind == "data":
        doc = data_doc(name, value)[1]
        return head + [""] + [f"   {line}".rstrip() for line in doc] + [""]
    return [f".. auto{kind}:: {module_name}.{name}"] + (["   :members:", "   :show-inheritance:"] if kind == "class" else []) + [""]


def reference_lines(module_name: str) -> List[str]:
    """The reStructuredText of a package's page: an entry per name of its ``__all__``."""
    lines = [f".. automodule:: {module_name}", ""]
    for name in public_names(module_name):
        lines += entry_lines(module_name, name)
    return lines


def submodules() -> List[str]:
    """Every public module of treadle below the packages of the reference, sorted."""
    import treadle

    return sorted(info.name for info in pkgutil.walk_packages(treadle.__path__, "treadle.")
                  if info.name not in PACKAGES and not info.name.split(".")[-1].startswith("_")
                  and ".model_zoo.configs" not in info.name)


def module_names(module_name: str) -> List[str]:
    """The names of ``module_name``'s ``__all__`` that the modules page documents:
    defined there, and on no package page."""
    module = importlib.import_module(module_name)
    names = []
    for name in getattr(module, "__all__", []):
        value = getattr(module, name)
        kind = kind_of(value)
        home = data_doc(name, value)[0] if kind == "data" else getattr(value, "__module__", None)
        if kind != "module" and home in (module_name, None) and full_entry(name, value) is None:
            names.append(name)
    return names


def module_lines() -> List[str]:
    """The reStructuredText of the modules page: each module's docstring, and its own names."""
    lines: List[str] = []
    for module_name in submodules():
        title = f"``{module_name}``"
        lines += [title, "-" * len(title), ""]
        if module_name in UTILS_MODULES:
            lines += [f"Documented on :doc:`the utils page <utils>`: :mod:`{module_name}`.", ""]
            continue
        parent, leaf = module_name.rsplit(".", 1)
        # A module named as the function its package exports (treadle.config.instantiate):
        # the name is the function's target.
        shadowed = not isinstance(getattr(sys.modules[parent], leaf, sys), types.ModuleType)
        lines += [f".. automodule:: {module_name}"] + (["   :no-index:"] if shadowed else []) + [""]
        for name in module_names(module_name):
            lines += entry_lines(module_name, name)
    return lines


class TreadleAPI(SphinxDirective):
    """``.. treadle-api:: PACKAGE``: the package's ``__all__``; without one, the modules page."""

    optional_arguments = 1

    def run(self) -> List[nodes.Node]:
        lines = reference_lines(self.arguments[0]) if self.arguments else module_lines()
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="<treadle-api>"), container)
        return container.children


def _import(path: str) -> Any:
    """The object a dotted ``path`` names: an attribute of its parent first
    (``treadle.engine.launch`` is the function, not the module), else a module."""
    parent, _, name = path.rpartition(".")
    for get_parent in (_import, importlib.import_module) if parent else ():
        try:
            return getattr(get_parent(parent), name)
        except (ImportError, AttributeError):
            pass
    return importlib.import_module(path)


def _documented(app: Sphinx, obj: Any, name: str) -> Optional[str]:
    """The documented name of ``obj`` (a constant: of that ``name`` and value), or None."""
    objects = app.env.get_domain("py").objects  # type: ignore[attr-defined]
    if not hasattr(app.env, "treadle_api_index"):
        index: Dict[int, str] = {}
        for full_name in objects:
            try:
                index.setdefault(id(_import(full_name)), full_name)
            except Exception:  # noqa: BLE001 - not importable: an entry written by hand
                continue
        app.env.treadle_api_index = index  # type: ignore[attr-defined]
    if not isinstance(obj, (int, float, str, bool, tuple)):
        return app.env.treadle_api_index.get(id(obj))  # type: ignore[attr-defined]
    for full_name, entry in objects.items():  # equal constants need not be one object
        if entry.objtype in ("data", "attribute") and full_name.endswith("." + name):
            try:
                if _import(full_name) == obj:
                    return full_name
            except Exception:  # noqa: BLE001
                continue
    return None


def _scopes(node: Any) -> List[str]:
    """Where ``node``'s target may be named: the docstring's own class and module
    (a docstring shown as ``treadle.engine.Trainer`` is written in its module), then the page's."""
    scopes = []
    parent = node
    while parent is not None and not getattr(parent, "source", None):
        parent = parent.parent
    match = re.search(r"docstring of ([\w.]+)$", getattr(parent, "source", "") or "")
    try:
        written_in = _import(match.group(1)) if match else None
    except Exception:  # noqa: BLE001 - not importable: no scope from it
        written_in = None
    function = getattr(written_in, "fget", written_in)
    qualname, module = getattr(function, "__qualname__", ""), getattr(function, "__module__", None)
    if isinstance(module, str) and module.startswith("treadle"):
        if "." in qualname or inspect.isclass(written_in):
            scopes.append(f"{module}.{qualname if inspect.isclass(written_in) else qualname.rsplit('.', 1)[0]}.")
        scopes.append(f"{module}.")
    module, klass = node.get("py:module"), node.get("py:class")
    return scopes + ([f"{module}.{klass}."] if module and klass else []) + ([f"{module}."] if module else []) + [""]


def resolve_by_import(app: Sphinx, env: Any, node: Any, contnode: Any) -> Optional[nodes.Node]:
    """A Python reference Sphinx's lookup missed, linked to the entry of the object its name imports."""
    if node.get("refdomain") != "py":
        return None
    for scope in _scopes(node):
        path = scope + node["reftarget"]
        try:
            obj = _import(path)
        except Exception:  # noqa: BLE001 - not in this scope
            continue
        module = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
        theirs = isinstance(module, str) and not module.startswith("treadle") and not isinstance(obj, tuple)
        if isinstance(obj, TypeVar) or re.search(r"(^|\.)_(?!_)", path) or theirs:
            return contnode  # no entry of its own: shown as code, as conf.py shows other packages' names
        owner, _, member = path.rpartition(".")
        documented = _documented(app, obj, member)
        owner_obj = _import(owner) if owner and documented is None else None
        for base in inspect.getmro(owner_obj) if inspect.isclass(owner_obj) else ():
            # A member (an instance attribute's ``#:`` comment too) documented under its class.
            found = _documented(app, base, "")
            if found and f"{found}.{member}" in env.get_domain("py").objects:
                documented = f"{found}.{member}"
                break
        if documented is None:
            continue
        py = env.get_domain("py")
        resolved = py.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], documented, node, contnode)
        found_any = None if resolved else py.resolve_any_xref(env, node["refdoc"], app.builder, documented, node, contnode)
        return resolved or (found_any[0][1] if found_any else None)
    return None


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_directive("treadle-api", TreadleAPI)
    app.connect("missing-reference", resolve_by_import, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
