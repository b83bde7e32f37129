"""``LazyCall``: record a call as a config node instead of making it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Union

from omegaconf import DictConfig

from ._values import tuples_to_lists
from .errors import ConfigError
from .locate import import_path, target_name

__all__ = ["LazyCall", "L"]


class LazyCall:
    """Wraps a callable so that calling it returns a config of the call.

    ``LazyCall(torch.nn.Linear)(in_features=3, out_features=4)`` returns the
    ``DictConfig`` ``{"_target_": torch.nn.Linear, "in_features": 3,
    "out_features": 4}``; :func:`~treadle.config.instantiate` later makes the
    call. Arguments may themselves be lazy calls, lists or dicts of them.

    Contract:
        - ``target`` is a callable or a dotted import path string
          (``"torch.nn.Linear"``); strings are not imported until instantiation.
        - Arguments are keyword-only (a config names every argument) and may not
          include ``_target_``.
        - Tuples in the arguments are stored as lists (see ``docs/config.md``).
        - The node has the ``allow_objects`` flag, so arguments may be arbitrary
          Python objects; :meth:`LazyConfig.save` only writes what YAML can hold.
        - Dataclass and attrs classes are stored by import path: OmegaConf would
          otherwise read such a class as a structured-config schema.
    """

    def __init__(self, target: Union[Callable[..., Any], str]) -> None:
        if isinstance(target, str):
            if not target or any(not part for part in target.split(".")):
                raise ConfigError(
                    f"LazyCall target {target!r} is not a dotted import path like 'torch.nn.Linear'"
                )
        elif not callable(target):
            raise ConfigError(
                f"LazyCall target must be a callable or a dotted import path string, "
                f"got {target!r} ({type(target).__name__})"
            )
        self._target = target

    def __call__(self, *args: Any, **kwargs: Any) -> DictConfig:
        if args:
            raise ConfigError(
                f"LazyCall({target_name(self._target)}) takes keyword arguments only "
                f"(a config names every argument); got {len(args)} positional argument(s)"
            )
        if "_target_" in kwargs:
            raise ConfigError(
                f"LazyCall({target_name(self._target)}) got '_target_' as an argument; "
                f"the target is set by LazyCall"
            )
        target: Any = self._target
        if isinstance(target, type) and (
            dataclasses.is_dataclass(target) or hasattr(target, "__attrs_attrs__")
        ):
            path = import_path(target)
            if path is None:
                raise ConfigError(
                    f"LazyCall target {target_name(target)} is a dataclass/attrs class that cannot "
                    f"be imported by name; define it at module level so that it can be stored "
                    f"as an import path"
                )
            target = path
        content = {"_target_": target, **tuples_to_lists(kwargs)}
        return DictConfig(content=content, flags={"allow_objects": True})

    def __repr__(self) -> str:
        return f"LazyCall({target_name(self._target)})"


L = LazyCall
"""Short alias of :class:`LazyCall`, as used in detectron2 configs: ``L(Model)(depth=50)``."""
