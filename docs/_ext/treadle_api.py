"""The API reference: autodoc's directives, an entry per name of an ``__all__``
(``.. treadle-api:: PACKAGE``; without one, the modules page), and references
resolved by import. docs/development.md ("The API reference") says why."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
import types
from typing import Any, Dict, List, Optional, Tuple, TypeVar

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import get_node_source

#: The packages of the reference, each a page docs/api/<last part>.rst (the
#: plain ``Trainer``'s first: the class most users read first).
PACKAGES = ["treadle.trainer", "treadle.engine", "treadle.hooks", "treadle.events", "treadle.checkpoint", "treadle.config",
            "treadle.data", "treadle.evaluation", "treadle.solver", "treadle.models", "treadle.model_zoo"]
#: The modules of treadle.utils a user calls, on docs/api/utils.rst (the package has no ``__all__``).
UTILS_MODULES = ["treadle.utils." + name for name in
                 ("comm", "logger", "file_io", "env", "device", "rng", "atomic", "run_folder")]
PAGES = PACKAGES + UTILS_MODULES


def public_names(module_name: str) -> List[str]:
    """The names ``module_name``'s ``__all__`` exports (an AttributeError without one)."""
    return list(importlib.import_module(module_name).__all__)


def kind_of(value: Any) -> str:
    """How the reference documents ``value``: ``module``, ``class``, ``function`` or ``data``."""
    return ("module" if isinstance(value, types.ModuleType) else "class" if inspect.isclass(value)
            else "function" if inspect.isroutine(value) else "data")


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


class _Shown:
    """A default value shown as written here (``...``: its ``repr`` names a memory address)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def call_signature(value: Any) -> str:
    """The parameters of the function ``value`` as a reader calls it,
    ``(config_path, trained=False)``: names and defaults, without the
    annotations (the full entry shows them); ``""`` when Python cannot tell."""
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return ""
    parameters = []
    for parameter in signature.parameters.values():
        parameter = parameter.replace(annotation=inspect.Parameter.empty)
        if parameter.default is not inspect.Parameter.empty and repr(parameter.default).startswith("<"):
            parameter = parameter.replace(default=_Shown("..."))
        parameters.append(parameter)
    return str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))


def entry_lines(module_name: str, name: str) -> List[str]:
    """The reStructuredText of ``module_name.name``'s entry."""
    value = getattr(importlib.import_module(module_name), name)
    kind, home = kind_of(value), full_entry(name, value)
    head = [f".. py:{'data' if kind == 'module' else kind}:: {name}", f"   :module: {module_name}"]
    if kind == "module":
        return head + ["", f"   The :mod:`{value.__name__}` package, also importable from here.", ""]
    if home is not None and home != (module_name, name):
        # A function's one-line entry shows how it is called (without one,
        # Sphinx writes empty parentheses); a class's shows its name only.
        if kind == "function":
            head[0] += call_signature(value)
        return head + ["   :no-index:", "",
                f"   Another name for :{'func' if kind == 'function' else kind}:`{'.'.join(home)}`, documented there.", ""]
    if kind == "data":
        doc = data_doc(name, value)[1]
        return head + [""] + [f"   {line}".rstrip() for line in doc] + [""]
    return [f".. auto{kind}:: {module_name}.{name}"] + (["   :members:", "   :show-inheritance:"] if kind == "class" else []) + [""]


def reference_lines(module_name: str) -> List[str]:
    """The reStructuredText of a package's page: an entry per name of its ``__all__``."""
    return [f".. automodule:: {module_name}", ""] + sum((entry_lines(module_name, n) for n in public_names(module_name)), [])


def submodules() -> List[str]:
    """Every public module of treadle that is no page of its own, sorted."""
    return sorted(info.name for info in pkgutil.walk_packages(importlib.import_module("treadle").__path__, "treadle.")
                  if info.name not in PAGES and not info.name.split(".")[-1].startswith("_")
                  and ".model_zoo.configs" not in info.name)


def module_names(module_name: str) -> List[str]:
    """The names of ``module_name``'s ``__all__`` that the modules page documents:
    defined there, and on no package page."""
    module = importlib.import_module(module_name)

    def home(name: str, value: Any) -> Optional[str]:
        return data_doc(name, value)[0] if kind_of(value) == "data" else getattr(value, "__module__", None)

    return [name for name, value in ((n, getattr(module, n)) for n in getattr(module, "__all__", []))
            if kind_of(value) != "module" and home(name, value) in (module_name, None) and full_entry(name, value) is None]


def module_lines() -> List[str]:
    """The reStructuredText of the modules page: each module's docstring, and its own names."""
    lines: List[str] = []
    for module_name in submodules():
        title = f"``{module_name}``"
        lines += [title, "-" * len(title), ""]
        parent, leaf = module_name.rsplit(".", 1)
        # A module named as the function its package exports (treadle.config.instantiate): the function's name.
        shadowed = not isinstance(getattr(sys.modules[parent], leaf, sys), types.ModuleType)
        lines += [f".. automodule:: {module_name}"] + (["   :no-index:"] if shadowed else []) + [""]
        lines += sum((entry_lines(module_name, name) for name in module_names(module_name)), [])
    return lines


class TreadleAPI(SphinxDirective):
    """``.. treadle-api:: PACKAGE``: the package's ``__all__``; without one, the modules page."""

    optional_arguments = 1

    def run(self) -> List[nodes.Node]:
        lines = reference_lines(self.arguments[0]) if self.arguments else module_lines()
        return self.parse_text_to_nodes("\n".join(lines), allow_section_headings=True)


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


def _key(name: str, obj: Any) -> Any:
    """What identifies ``obj``: itself, or a constant's name and value (equal constants need not be one object)."""
    return (name.rpartition(".")[2], repr(obj)) if isinstance(obj, (int, float, str, bool, tuple)) else id(obj)


def _documented(app: Sphinx, key: Any) -> Optional[str]:
    """The name of the entry that documents the object of ``key``, or None."""
    if not hasattr(app.env, "treadle_api_index"):
        index: Dict[Any, str] = {}
        for full_name in app.env.get_domain("py").objects:  # type: ignore[attr-defined]
            try:
                index.setdefault(_key(full_name, _import(full_name)), full_name)
            except Exception:  # noqa: BLE001 - not importable: an entry written by hand
                continue
        app.env.treadle_api_index = index  # type: ignore[attr-defined]
    return app.env.treadle_api_index.get(key)  # type: ignore[attr-defined]


def _scopes(node: Any) -> List[str]:
    """Where ``node``'s target may be named: the docstring's own class and module
    (a docstring shown as ``treadle.engine.Trainer`` is written in its module), then the page's."""
    try:
        match = re.search(r"docstring of ([\w.]+)$", get_node_source(node))
        written_in = getattr(_import(match.group(1)), "fget", None) or _import(match.group(1)) if match else None
    except Exception:  # noqa: BLE001 - no docstring, or not importable: no scope from it
        written_in = None
    qualname, module = getattr(written_in, "__qualname__", ""), getattr(written_in, "__module__", "")
    if not inspect.isclass(written_in):
        qualname = qualname.rpartition(".")[0]
    scopes = [f"{module}.{qualname}."] * bool(qualname) + [f"{module}."] if str(module).startswith("treadle") else []
    module, klass = node.get("py:module"), node.get("py:class")
    return scopes + ([f"{module}.{klass}."] if module and klass else []) + ([f"{module}."] if module else []) + [""]


def resolve_by_import(app: Sphinx, env: Any, node: Any, contnode: Any) -> Optional[nodes.Node]:
    """A Python reference Sphinx's lookup missed, linked to the entry of the object its name imports."""
    if node.get("refdomain") != "py":
        return None
    py = env.get_domain("py")
    for path in (scope + node["reftarget"] for scope in _scopes(node)):
        try:
            obj = _import(path)
        except Exception:  # noqa: BLE001 - not in this scope
            continue
        module = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
        theirs = not path.startswith("treadle.") if isinstance(obj, (int, float, str, bool, tuple)) else (
            isinstance(module, str) and not module.startswith("treadle"))
        if isinstance(obj, TypeVar) or re.search(r"(^|\.)_(?!_)", path) or theirs:
            return contnode  # no entry of its own: shown as code, as conf.py shows other packages' names
        documented = _documented(app, _key(path, obj))
        if documented is not None:
            # Any role: ``:func:`` may name a class, as Python calls one.
            found = py.resolve_any_xref(env, node["refdoc"], app.builder, documented, node, contnode)
            return found[0][1] if found else None
    return None


def setup(app: Sphinx) -> Dict[str, Any]:
    app.add_directive("treadle-api", TreadleAPI)
    app.connect("missing-reference", resolve_by_import, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
