"""Internal: reading config files into ``DictConfig``: Python files (executed, with relative
imports of sibling config files) and YAML files.

A Python config is executed like a module. While it runs, ``builtins.__import__``
is replaced by a function that serves *relative* imports made by config files
(``from .common.train import train``, ``from ..common import optim``) by
executing the sibling config file; every other import goes to the original
function. The replacement is undone in ``finally``, also when a config raises.
"""

from __future__ import annotations

import builtins
import contextlib
import enum
import os
import pathlib
import posixpath
import re
import sys
import threading
import types
from typing import Any, Dict, Iterator, List, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from treadle.utils.file_io import PathManager

from ._values import tuple_nodes_to_lists, tuples_to_lists
from .errors import ConfigError, first_line

__all__ = ["load_config_file", "PYTHON_SUFFIXES", "YAML_SUFFIXES"]

PYTHON_SUFFIXES = (".py",)
YAML_SUFFIXES = (".yaml", ".yml")

# The globals of a config file carry its path under this name; it is how the
# import hook tells a config file's relative import from a library's.
_MARKER = "__treadle_config_file__"
# Patching builtins is process-wide: one load at a time. Re-entrant, because a
# config may itself call LazyConfig.load.
_LOCK = threading.RLock()
# Config files being executed, outermost first; guarded by _LOCK.
_executing: List[str] = []

_PLAIN_TYPES = (str, bytes, int, float, bool, type(None), pathlib.PurePath, enum.Enum)


def _is_uri(path: str) -> bool:
    return "://" in path


def _resolution_path(filename: str) -> str:
    """The absolute path relative imports are resolved from (URIs are already absolute)."""
    return filename if _is_uri(filename) else os.path.abspath(filename)


def _module_name(path: str) -> str:
    stem = posixpath.splitext(posixpath.basename(path))[0] or "config"
    return "_treadle_config." + re.sub(r"\W", "_", stem)


def _as_config_value(value: Any) -> Any:
    """dicts become ``DictConfig``, lists and tuples ``ListConfig``; other values are kept."""
    if isinstance(value, dict):
        return DictConfig(tuples_to_lists(value), flags={"allow_objects": True})
    if isinstance(value, (list, tuple)):
        return ListConfig(tuples_to_lists(value), flags={"allow_objects": True})
    return value


def _keeps(name: str, value: Any) -> bool:
    """Whether a module-level name of a config file becomes a key of the config."""
    if name.startswith("_"):
        return False
    # Modules, functions and classes are the tools used to write the config, not config.
    return isinstance(value, (DictConfig, ListConfig, dict, list, tuple) + _PLAIN_TYPES)


def _check_file(filename: str) -> None:
    if PathManager.isfile(filename):
        return
    if PathManager.isdir(filename):
        raise ConfigError(f"Config file '{filename}' is a directory, not a file")
    raise ConfigError(f"Config file not found: '{filename}'")


def _failing_line(tb: Any, filename: str) -> str:
    """", line N" of the innermost traceback entry in ``filename`` (or "")."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f", line {line}" if line is not None else ""


def _compile(shown: str) -> types.CodeType:
    try:
        with PathManager.open(shown, "rb") as f:
            source = f.read()
    except OSError as e:
        raise ConfigError(f"Cannot read config file '{shown}': {e}") from e
    try:
        return compile(source, shown, "exec", dont_inherit=True)
    except SyntaxError as e:
        line = f", line {e.lineno}" if e.lineno else ""
        where = e.filename or shown
        raise ConfigError(f"Syntax error in config file '{where}'{line}: {e.msg}") from None
    except ValueError as e:  # null bytes, undecodable source
        raise ConfigError(f"Cannot compile config file '{shown}': {e}") from None


def _execute(shown: str, path: str) -> Dict[str, Any]:
    """Executes config file ``shown``, whose relative imports resolve from ``path``,
    and returns its globals."""
    if path in _executing:
        cycle = _executing[_executing.index(path) :] + [path]
        raise ConfigError("Circular import between config files: " + " -> ".join(cycle))
    code = _compile(shown)
    namespace: Dict[str, Any] = {
        "__name__": _module_name(path),
        "__file__": path,
        "__builtins__": builtins,
        _MARKER: path,
    }
    _executing.append(path)
    try:
        exec(code, namespace)
    except ConfigError:
        raise
    except Exception as e:
        line = _failing_line(e.__traceback__, shown)
        raise ConfigError(
            f"Error while executing config file '{shown}'{line}: {type(e).__name__}: {e}"
        ) from e
    finally:
        _executing.pop()
    return namespace


def _file_module(path: str, fromlist: Sequence[str], where: str) -> types.ModuleType:
    """Executes config file ``path``; returns it as a module whose dicts and lists are configs."""
    try:
        namespace = _execute(path, path)
    except ConfigError as e:
        if hasattr(e, "add_note"):  # Python >= 3.11: the import chain shows in tracebacks
            e.add_note(f"imported at {where}")
        raise
    module = types.ModuleType(namespace["__name__"])
    module.__file__ = path
    for name, value in namespace.items():
        if not (name.startswith("__") and name.endswith("__")):
            setattr(module, name, _as_config_value(value))
    for name in fromlist:
        if name != "*" and not hasattr(module, name):
            defined = ", ".join(n for n in vars(module) if not n.startswith("_")) or "nothing"
            raise ConfigError(
                f"{where}: cannot import name '{name}' from config file '{path}' "
                f"(it defines: {defined})"
            )
    return module


def _package_module(directory: str, fromlist: Sequence[str], where: str) -> types.ModuleType:
    """A directory of config files as a package.

    ``from .common import optim`` loads ``common/optim.py`` as the module ``optim``;
    an ``__init__.py`` in the directory, if any, provides the package's own names.
    """
    init = posixpath.join(directory, "__init__.py")
    if PathManager.isfile(init):
        module = _file_module(init, (), where)
    else:
        module = types.ModuleType(_module_name(directory))
    module.__path__ = [directory]
    for name in fromlist:
        if name == "*" or hasattr(module, name):
            continue
        sub = posixpath.join(directory, name)
        if PathManager.isfile(sub + ".py"):
            setattr(module, name, _file_module(sub + ".py", (), where))
        elif PathManager.isdir(sub):
            setattr(module, name, _package_module(sub, (), where))
        else:
            raise ConfigError(
                f"{where}: cannot import name '{name}': found neither '{sub}.py' "
                f"nor a directory '{sub}'"
            )
    return module


def _import_relative(
    name: str, importer: str, fromlist: Sequence[str], level: int, line: int
) -> types.ModuleType:
    """Serves ``from <level dots><name> import <fromlist>`` written at ``line`` of ``importer``."""
    where = f"config file '{importer}', line {line}"
    base = posixpath.dirname(importer)
    for _ in range(level - 1):
        base = posixpath.dirname(base)
    if not name:
        return _package_module(base, fromlist, where)
    target = posixpath.join(base, *name.split("."))
    if PathManager.isfile(target + ".py"):
        return _file_module(target + ".py", fromlist, where)
    if PathManager.isdir(target):
        return _package_module(target, fromlist, where)
    raise ConfigError(
        f"{where}: 'from {'.' * level}{name} import ...' found neither '{target}.py' "
        f"nor a directory '{target}'"
    )


@contextlib.contextmanager
def _config_imports() -> Iterator[None]:
    """Routes relative imports made by config files to :func:`_import_relative` while active."""
    original = builtins.__import__

    def config_import(
        name: str,
        globals: Any = None,
        locals: Any = None,
        fromlist: Sequence[str] = (),
        level: int = 0,
    ) -> Any:
        if level > 0 and globals is not None and _MARKER in globals:
            # The caller is the config file's own frame: its line is the import statement.
            line = sys._getframe(1).f_lineno
            return _import_relative(name, globals[_MARKER], tuple(fromlist or ()), level, line)
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = config_import  # type: ignore[assignment]  # the same call, typed more loosely
    try:
        yield
    finally:
        builtins.__import__ = original


def _load_python(filename: str) -> DictConfig:
    with _LOCK, _config_imports():
        namespace = _execute(filename, _resolution_path(filename))
    cfg = DictConfig({}, flags={"allow_objects": True})
    for name, value in namespace.items():
        if _keeps(name, value):
            try:
                cfg[name] = tuples_to_lists(value)
            except OmegaConfBaseException as e:
                first = first_line(e)
                raise ConfigError(
                    f"Config file '{filename}': top-level name '{name}' cannot be a config "
                    f"value: {first}"
                ) from e
    return tuple_nodes_to_lists(cfg)


def _load_yaml(filename: str) -> DictConfig:
    try:
        with PathManager.open(filename, "r", encoding="utf-8") as f:
            cfg = OmegaConf.load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"Invalid YAML in config file '{filename}'{line}: {problem}") from e
    except (OmegaConfBaseException, UnicodeDecodeError) as e:
        first = first_line(e)
        raise ConfigError(f"Cannot load config file '{filename}': {first}") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError(
            f"Config file '{filename}' must hold a mapping of keys at the top level, not a list"
        )
    return DictConfig(cfg, flags={"allow_objects": True})


def load_config_file(filename: str) -> DictConfig:
    """Loads a ``.py`` or ``.yaml``/``.yml`` config file into a ``DictConfig``.

    Python files: the module-level names that hold configs, dicts, lists,
    tuples or plain values (str, numbers, bools, None, paths, enums) become the
    keys; names starting with ``_``, modules, functions, classes and other
    objects are dropped. Relative imports load sibling config files.

    Raises:
        ConfigError: naming the file for a missing file, an unsupported suffix,
            a syntax error (with its line), an exception while executing the file
            (with its line), a relative import that finds no config file, a
            circular import, or invalid YAML (with its line).
    """
    if not isinstance(filename, (str, os.PathLike)):
        raise ConfigError(f"Config file name must be a path, got {filename!r}")
    filename = os.fspath(filename)
    _check_file(filename)
    suffix = posixpath.splitext(filename)[1].lower()
    if suffix in PYTHON_SUFFIXES:
        return _load_python(filename)
    if suffix in YAML_SUFFIXES:
        return _load_yaml(filename)
    valid = ", ".join(PYTHON_SUFFIXES + YAML_SUFFIXES)
    raise ConfigError(
        f"Unsupported config file '{filename}': expected a file ending in one of {valid}"
    )
