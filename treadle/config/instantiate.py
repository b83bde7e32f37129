"""``instantiate``: turn a config of lazy calls into the objects it describes."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
from typing import Any, Callable, Dict, List

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ._keys import join_path, node_path
from ._values import SEQUENCE_CONFIGS
from .errors import ConfigError, first_line
from .locate import NotLocatable, resolve_path, target_name
from .nodes import is_none, metadata_of

__all__ = ["instantiate"]


def _shown(path: str) -> str:
    return f"'{path}'" if path else "<root>"


def _read(container: Any, key: Any, path: str) -> Any:
    """``container[key]``, interpolations resolved; a missing or broken value is a ConfigError."""
    try:
        return container[key]
    except OmegaConfBaseException as e:
        where = _shown(join_path(path, key))
        raise ConfigError(f"Cannot read config value {where}: {first_line(e)}") from e


def _resolve_target(target: Any, path: str) -> Callable[..., Any]:
    if isinstance(target, str):
        try:
            obj = resolve_path(target)
        except NotLocatable as e:
            raise ConfigError(
                f"Cannot import _target_ '{target}' of config node {_shown(path)}: {e}"
            ) from e
    elif callable(target):
        return target
    else:
        raise ConfigError(
            f"_target_ of config node {_shown(path)} must be a callable or an import path string, "
            f"got {target!r} ({type(target).__name__})"
        )
    if not callable(obj):
        raise ConfigError(
            f"_target_ '{target}' of config node {_shown(path)} is a {type(obj).__name__}, "
            f"not a callable"
        )
    return obj


def _argument_hint(target: Callable[..., Any], kwargs: Dict[str, Any]) -> str:
    """Why ``kwargs`` do not fit ``target``'s signature, or a remark that they do
    (then the TypeError came from inside the call)."""
    try:
        signature = inspect.signature(target)
        signature.bind(**kwargs)
    except TypeError:
        pass
    except ValueError:  # no signature available (some builtins)
        return ""
    else:
        return " (raised inside the call; the arguments match its signature)"
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return ""
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    hints = []
    for arg in kwargs:
        if arg not in params:
            close = difflib.get_close_matches(arg, names, n=1)
            if close:
                hints.append(f"'{close[0]}' instead of '{arg}'")
    if hints:
        return "; did you mean " + ", ".join(hints) + "?"
    return ("; its arguments are: " + ", ".join(names)) if names else ""


def _call(target: Callable[..., Any], kwargs: Dict[str, Any], path: str, raw_target: Any) -> Any:
    try:
        return target(**kwargs)
    except ConfigError:
        raise
    except TypeError as e:
        hint = _argument_hint(target, kwargs)
        # Python 3.13 suggests a close name itself; the hint says it once, the same on every version.
        message = re.sub(r"\. Did you mean '[^']*'\?$", "", str(e)) if hint.startswith("; did you mean") else str(e)
        raise ConfigError(
            f"Cannot instantiate config node {_shown(path)} (_target_ {target_name(raw_target)}): {message}{hint}"
        ) from e
    except Exception as e:
        # Keep the original exception type (callers may catch it) and add where it came from.
        if hasattr(e, "add_note"):
            name = target_name(raw_target)
            e.add_note(f"while instantiating config node {_shown(path)} (_target_ {name})")
        raise


def _instantiate(node: Any, path: str) -> Any:
    if isinstance(node, SEQUENCE_CONFIGS):
        if is_none(node):
            return None
        values = [_instantiate(_read(node, i, path), join_path(path, i)) for i in range(len(node))]
        return values if isinstance(node, ListConfig) else tuple(values)
    if type(node) in (list, tuple):
        values = [_instantiate(v, join_path(path, i)) for i, v in enumerate(node)]
        return values if isinstance(node, list) else tuple(values)
    if isinstance(node, DictConfig):
        if is_none(node):
            return None
        object_type = metadata_of(node).object_type
        if object_type is not None and dataclasses.is_dataclass(object_type):
            try:
                return OmegaConf.to_object(node)
            except OmegaConfBaseException as e:
                raise ConfigError(
                    f"Cannot instantiate config node {_shown(path)}: {first_line(e)}"
                ) from e
        items = [(key, _read(node, key, path)) for key in node.keys()]
    elif type(node) is dict:
        items = list(node.items())
    else:
        # Objects (tensors, modules, numbers, already built things) are not configs.
        return node
    entries = dict(items)
    if "_target_" not in entries:
        return {key: _instantiate(value, join_path(path, key)) for key, value in items}
    raw_target = entries.pop("_target_")
    target = _resolve_target(raw_target, path)
    bad: List[Any] = [key for key in entries if not isinstance(key, str)]
    if bad:
        raise ConfigError(f"Config node {_shown(path)} has non-string argument names {bad!r}")
    kwargs = {str(key): _instantiate(value, join_path(path, key)) for key, value in entries.items()}
    return _call(target, kwargs, path, raw_target)


def instantiate(cfg: Any) -> Any:
    """Builds the objects described by ``cfg``, recursively.

    - A dict/``DictConfig`` with ``_target_`` becomes ``target(**arguments)``,
      its arguments instantiated first (depth first, in key order).
    - A dict/``DictConfig`` without ``_target_`` becomes a plain ``dict`` of
      instantiated values; a list/``ListConfig`` a plain ``list``; a tuple a tuple.
      The result never contains OmegaConf nodes, so user code gets ordinary
      Python containers.
    - A ``DictConfig`` typed by a dataclass becomes that dataclass.
    - Anything else (including objects stored in the config) is returned unchanged.

    Interpolations (``${train.output_dir}``) are resolved against the root of
    the config the node belongs to.

    Raises:
        ConfigError: naming the config path of the node (``model.backbone``) for a
            ``_target_`` that cannot be imported or is not callable, a call that
            raises ``TypeError`` (wrong arguments: the message includes the
            target, the underlying message and close argument names), and a
            missing (``???``) or unresolvable value. Other exceptions raised by a
            target propagate unchanged, with a note naming the node.
    """
    return _instantiate(cfg, node_path(cfg))
