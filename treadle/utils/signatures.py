"""What a callable's signature says about how it can be called."""

from __future__ import annotations

import inspect
from typing import Any, Callable

__all__ = ["required_positional"]


def required_positional(fn: Callable[..., Any]) -> int:
    """How many positional parameters ``fn`` requires: parameters with
    defaults are options, not slots (a factory's ``gamma=0.9``, a keyword
    bound by ``functools.partial``); 1 where the signature cannot be read."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)
