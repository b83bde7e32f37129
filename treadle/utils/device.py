"""Choosing a device and moving nested batches onto it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Union

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
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} was asked for, but CUDA is not available on this machine")
    return device


def to_device(obj: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """Moves every tensor inside tuples, lists, dicts, named tuples and
    dataclasses to ``device``; other objects are returned as they are.

    Objects with a ``.to(device)`` method that are not tensors (Hugging Face's
    ``BatchEncoding``, for one) are moved with it.
    """
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    # Plain tuples and lists first: the Mapping test below is an ABC check, slower.
    if type(obj) in (tuple, list):
        return type(obj)(to_device(v, device, non_blocking) for v in obj)
    if isinstance(obj, Mapping):
        moved = {k: to_device(v, device, non_blocking) for k, v in obj.items()}
        if type(obj) is dict:
            return moved
        try:
            return type(obj)(moved)
        except TypeError:
            to = getattr(obj, "to", None)
            return to(device) if callable(to) else moved
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # named tuple
        return type(obj)(*(to_device(v, device, non_blocking) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device, non_blocking) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: to_device(getattr(obj, f.name), device, non_blocking) for f in dataclasses.fields(obj) if f.init}
        )
    return obj
