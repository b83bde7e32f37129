"""Choosing a device and moving nested batches onto it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional, Union, cast

import torch

__all__ = ["resolve_device", "to_device"]


def resolve_device(device: Union[str, torch.device, None] = "auto") -> torch.device:
    """``"auto"`` (or ``None``) picks cuda, then mps, then cpu; anything else is
    checked to exist."""
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(device)
    if not _available(device.type):
        name = {"cuda": "CUDA", "mps": "MPS"}.get(device.type, device.type)
        raise ValueError(f"device={str(device)!r} was asked for, but {name} is not available on this machine")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())  # this process's GPU
    return device


def _available(device_type: str) -> bool:
    """Whether this machine has a device of ``device_type``: torch's backend
    module says (``torch.cuda``, ``torch.backends.mps``, ``torch.xpu``...);
    one that cannot tell (cpu, meta) is taken to have it."""
    if device_type == "mps":
        backend = getattr(torch.backends, "mps", None)
    else:
        backend = getattr(torch, device_type, None)
    is_available = getattr(backend, "is_available", None)
    return not callable(is_available) or bool(is_available())


def to_device(
    obj: Any, device: Union[str, torch.device], non_blocking: Optional[bool] = None
) -> Any:
    """Returns ``obj`` with every tensor in it moved to ``device``.

    Walks tuples, lists, named tuples, mappings and dataclasses; any other
    object with a ``.to`` method (Hugging Face's ``BatchEncoding``, for one) is
    moved with ``.to(device)``; everything else is returned as it is. The input
    is not modified.

    ``non_blocking=None`` means non-blocking copies only towards an accelerator:
    a copy to the host with ``non_blocking=True`` may be read before it has
    landed, while copies towards an accelerator are ordered on its stream.
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if non_blocking is None:
        non_blocking = device.type != "cpu"
    return _move(obj, device, non_blocking)


def _move(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    # Plain tuples and lists first: the Mapping test below is an ABC check, slower.
    if type(obj) in (tuple, list):
        return type(obj)(_move(v, device, non_blocking) for v in obj)
    # Leaves that are common in batches and must not reach the .to() probe.
    if obj is None or isinstance(obj, (str, bytes, int, float)):
        return obj
    if isinstance(obj, Mapping):
        moved = {k: _move(v, device, non_blocking) for k, v in obj.items()}
        if type(obj) is dict:
            return moved
        try:
            return cast(Any, type(obj))(moved)  # a Mapping type built from a dict, as most are
        except TypeError:
            to = getattr(obj, "to", None)
            return to(device) if callable(to) else moved
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # named tuple
        return type(obj)(*(_move(v, device, non_blocking) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(v, device, non_blocking) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: _move(getattr(obj, f.name), device, non_blocking) for f in dataclasses.fields(obj) if f.init}
        )
    to = getattr(obj, "to", None)
    # A class's .to is an unbound method, not a way to move it.
    if callable(to) and not isinstance(obj, type):
        return to(device)
    return obj
