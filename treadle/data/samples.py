"""What a list given as data is, and how a message shows its items.

A list (any sequence: an object with ``__len__`` and ``__getitem__``, a
Hugging Face ``datasets.Dataset`` included) is what torch's ``DataLoader``
takes it for: a map-style dataset of samples, whatever their shapes (a
sample ``(x[5, 8], y[5])`` of per-token tags, an image and its mask). Its
items are never inspected to guess whether they are batches: ready-made
batches come as a ``DataLoader`` or as an iterable that is not a sequence (a
generator; ``DataLoader(batches, batch_size=None)`` reads a list of batches
as they are, once per epoch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["describe_item"]

_SCALARS = (int, float, complex, str, bytes, bool, type(None))


def describe_item(item: Any) -> str:
    """A short shape of ``item`` for messages: ``(Tensor[6], int)``, ``{input_ids: Tensor[16], ...}``."""

    def one(value: Any) -> str:
        shape = getattr(value, "shape", None)
        if shape is not None and not isinstance(value, _SCALARS):
            return f"{type(value).__name__}[{', '.join(str(int(d)) for d in shape)}]"
        if isinstance(value, Mapping):
            inner = [f"{k}: {one(v)}" for k, v in list(value.items())[:3]]
            return "{" + ", ".join(inner) + (", ...}" if len(value) > 3 else "}")
        if isinstance(value, (list, tuple)) and value and not isinstance(value, str):
            inner = [one(v) for v in value[:3]]
            return "(" + ", ".join(inner) + (", ...)" if len(value) > 3 else ")")
        return type(value).__name__

    return one(item)
