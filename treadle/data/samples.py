"""Telling a sequence of samples from a sequence of batches.

torch's ``DataLoader`` takes any sequence (a list of ``(x, y)`` pairs, of
dicts) as a map-style dataset of samples. A trainer that also takes ready
batches (a list of them, or any object with ``__len__`` and ``__getitem__``
that yields them) must tell the two apart, or a list of samples trains one
sample per update. :func:`holds_samples` decides from the first item:

- a batch is what a collate function makes: every tensor in it has a batch
  dimension, the same for all of them, and at least one of them has a
  dimension more (the features, the sequence, the pixels); a list of strings
  counts as a one-dimensional tensor of its length; detectron2's list of
  per-sample dicts is a batch too;
- anything else is a sample: an item holding a number, a string, a 0-dim
  tensor, tensors whose first dimensions differ (``(features[6], target[])``),
  or only one-dimensional tensors (a tokenized text: ``input_ids[16]``,
  ``labels[16]``).

The rule can misjudge a batch of one-dimensional tensors only
(``{"x": x[32], "y": y[32]}``); a torch ``Dataset`` or ``DataLoader`` says
what it is and is never inspected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator, Tuple

__all__ = ["holds_samples", "is_sample", "describe_item"]

_SCALARS = (int, float, complex, str, bytes, bool, type(None))


def _shapes(item: Any) -> Iterator[Tuple[int, ...]]:
    """The shape of every leaf of ``item``: tensors and arrays by their
    shape, a list of scalars as one dimension, anything else as a scalar."""
    shape = getattr(item, "shape", None)
    if shape is not None and not isinstance(item, _SCALARS):
        yield tuple(int(d) for d in shape)
    elif isinstance(item, Mapping):
        for value in item.values():
            yield from _shapes(value)
    elif isinstance(item, (list, tuple)):
        if item and all(isinstance(v, _SCALARS) for v in item):
            yield (len(item),)
        else:
            for value in item:
                yield from _shapes(value)
    else:
        yield ()


def is_sample(item: Any) -> bool:
    """Whether ``item`` is one sample rather than a batch (rules: the module docstring)."""
    if isinstance(item, (list, tuple)) and item and all(isinstance(v, Mapping) for v in item):
        return False  # detectron2's batch: a list of per-sample dicts
    shapes = list(_shapes(item))
    if not shapes or any(len(s) == 0 for s in shapes):
        return True
    if len({s[0] for s in shapes}) > 1:
        return True
    return max(len(s) for s in shapes) < 2


def holds_samples(sequence: Sequence[Any]) -> bool:
    """Whether the items of ``sequence`` (a list, or an object with
    ``__len__`` and ``__getitem__``) are samples to batch; an empty one holds none."""
    return len(sequence) > 0 and is_sample(sequence[0])


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
