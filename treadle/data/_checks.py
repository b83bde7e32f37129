"""Argument checks shared by the data modules: one clear message per bad value."""

from __future__ import annotations

from typing import Any, Optional

from torch.utils.data import IterableDataset

from treadle.utils import comm

__all__ = ["check_int", "resolve_rank_and_world", "is_map_style"]


def check_int(name: str, value: Any, *, minimum: int) -> int:
    """Returns ``value`` if it is an int ``>= minimum``; raises naming ``name`` otherwise."""
    # bool is an int subclass, but `shuffle=True` passed as a size is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def resolve_rank_and_world(rank: Optional[int], world_size: Optional[int]) -> tuple[int, int]:
    """Fills a missing rank or world size from :mod:`treadle.utils.comm` and checks the pair."""
    world_size = comm.get_world_size() if world_size is None else world_size
    rank = comm.get_rank() if rank is None else rank
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got rank={rank}")
    return rank, world_size


def is_map_style(dataset: Any) -> bool:
    """True for a map-style dataset, False for an iterable one; raises for anything else.

    A ``torch.utils.data.IterableDataset`` is iterable even when it defines
    ``__len__``; other objects are map-style when they have both ``__len__``
    and ``__getitem__`` (lists included), else iterable when they have ``__iter__``.
    """
    if isinstance(dataset, IterableDataset):
        return False
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return True
    if hasattr(dataset, "__iter__"):
        return False
    raise TypeError(
        f"dataset of type {type(dataset).__name__} is neither map-style "
        "(__len__ and __getitem__) nor iterable (__iter__)"
    )
