"""Rules for config values: small checks that raise a one-line :class:`ConfigError`.

A rule takes ``(key, value)``, where ``key`` is the full dotted key
(``train.checkpointer.period``), and raises a ``ConfigError`` that names the
key, the value and what would be accepted; it returns nothing when the value is
good. The table of ``train`` keys (:mod:`treadle.config.train_keys`) gives each
key one of these; validation runs them before anything is built.

Importing this module imports neither torch nor OmegaConf: the device rule
imports torch when it runs.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence

from .errors import ConfigError

__all__ = [
    "Rule",
    "shown",
    "is_int",
    "is_number",
    "integer",
    "positive_number",
    "non_negative_number",
    "choice",
    "boolean",
    "text",
    "path",
    "seed",
    "device",
    "compile_backend",
    "num_threads",
    "anything",
]

#: A check of one config value: called with the key's dotted path and the
#: value, it raises a one-line ValueError naming the key when the value is wrong.
Rule = Callable[[str, Any], None]


def shown(value: Any) -> str:
    """``value`` as an error message shows it: strings quoted, the rest as ``str``."""
    return repr(value) if isinstance(value, str) else str(value)


def is_int(value: Any) -> bool:
    """An integer, or a float with an integer value (``1e3`` from the command line); not a bool."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer()


def is_number(value: Any) -> bool:
    """A finite int or float; not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(minimum: int, *, none: bool = False) -> Rule:
    """An integer ``>= minimum`` (or None when ``none``)."""

    def rule(key: str, value: Any) -> None:
        if value is None and none:
            return
        if not is_int(value) or value < minimum:
            what = f"an integer >= {minimum}" + (" or None" if none else "")
            raise ConfigError(f"{key} must be {what}, got {shown(value)}")

    return rule


def positive_number(*, none: bool = False, below_one: bool = False, unit: str = "") -> Rule:
    """A number ``> 0`` (and ``< 1`` when ``below_one``; or None when ``none``),
    of ``unit`` (``"seconds"``) when the message should say it."""

    def rule(key: str, value: Any) -> None:
        if value is None and none:
            return
        if not is_number(value) or value <= 0 or (below_one and value >= 1):
            what = "a number in (0, 1)" if below_one else "a positive number" + (f" of {unit}" if unit else "")
            raise ConfigError(f"{key} must be {what}{' or None' if none else ''}, got {shown(value)}")

    return rule


def non_negative_number(key: str, value: Any) -> None:
    """A number ``>= 0``."""
    if not is_number(value) or value < 0:
        raise ConfigError(f"{key} must be a number >= 0, got {shown(value)}")


def choice(choices: Sequence[Any]) -> Rule:
    """One of ``choices`` (None among them when None is allowed)."""

    def rule(key: str, value: Any) -> None:
        if value not in choices:
            listed = ", ".join("None" if c is None else repr(c) for c in choices)
            raise ConfigError(f"{key} must be one of {listed}; got {shown(value)}")

    return rule


def boolean(key: str, value: Any) -> None:
    """``True`` or ``False`` (not 0 and 1, not ``"yes"``)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {shown(value)}")


def text(*, empty: bool = True, none: bool = False) -> Rule:
    """A string (non-empty unless ``empty``; or None when ``none``)."""

    def rule(key: str, value: Any) -> None:
        if value is None and none:
            return
        if not isinstance(value, str) or (not empty and not value):
            what = "a non-empty string" if not empty else "a string"
            raise ConfigError(f"{key} must be {what}{' or None' if none else ''}, got {shown(value)}")

    return rule


def path(*, empty: bool = True, none: bool = False, inside: bool = False) -> Rule:
    """A path: a string or an ``os.PathLike`` (``pathlib.Path``), which
    code reads as its string (non-empty unless ``empty``; or None when
    ``none``). ``inside``: a folder inside the run's folder, which is what its
    lock covers: a relative path that neither leaves it (``..``) nor is it (``.``)."""

    def rule(key: str, value: Any) -> None:
        if value is None and none:
            return
        text = os.fspath(value) if isinstance(value, os.PathLike) else value
        if not isinstance(text, str) or (not empty and not text):
            what = "a non-empty path" if not empty else "a path"
            got = shown(value) if isinstance(value, str) else f"{type(value).__name__} {shown(value)}"
            raise ConfigError(f"{key} must be {what} (a str or os.PathLike){' or None' if none else ''}, got {got}")
        if inside and text:
            normal = os.path.normpath(text)
            if os.path.isabs(text) or normal == os.curdir or normal == os.pardir or normal.startswith(os.pardir + os.sep):
                where = "is output_dir itself" if normal == os.curdir else "is outside output_dir"
                raise ConfigError(
                    f"{key}={text!r} {where}: give a folder inside output_dir (a relative path such as "
                    f"'{key.rsplit('.', 1)[-1].replace('_dir', '')}'), or None for output_dir itself"
                )

    return rule


def compile_backend(key: str, value: Any) -> None:
    """A backend ``torch.compile`` knows (``torch.compiler.list_backends``), or a callable one."""
    if callable(value) or value == "inductor":  # the default is known without importing the compiler
        return
    text(empty=False)(key, value)
    import torch

    known = torch.compiler.list_backends(exclude_tags=())
    if value not in known:
        raise ConfigError(f"{key}={value!r} is not a torch.compile backend; choose one of {', '.join(sorted(known))}")


def seed(key: str, value: Any) -> None:
    """An integer, or None; a negative one (or None) asks for a random seed."""
    if value is not None and not is_int(value):
        raise ConfigError(f"{key} must be an integer (negative: pick one at random) or None, got {shown(value)}")


def device(key: str, value: Any) -> None:
    """``"auto"``, or a device that exists on this machine (``cpu``, ``cuda``, ``cuda:N``, ``mps``)."""
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {shown(value)}")
    if value == "auto":
        return
    import torch  # here, not at the top: the table of keys is read without torch

    try:
        parsed = torch.device(value)
    except RuntimeError:
        raise ConfigError(
            f"{key}={value!r} is not a device; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
        ) from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={value!r}, but CUDA is not available on this machine; use 'cpu' or 'auto'")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ConfigError(
                f"{key}={value!r}, but this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif parsed.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError(f"{key}={value!r}, but MPS is not available on this machine; use 'cpu' or 'auto'")
    elif parsed.type != "cpu":
        raise ConfigError(f"{key}={value!r} is not supported; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")


def num_threads(key: str, value: Any) -> None:
    """``"auto"``, ``None`` (torch's count) or an integer ``>= 1``: the CPU threads of a run."""
    if value is None or value == "auto" or (is_int(value) and value >= 1):
        return
    raise ConfigError(f"{key} must be 'auto', None (torch's count) or an integer >= 1, got {shown(value)}")


def anything(key: str, value: Any) -> None:
    """Any value (a ``LazyCall``, a dict of tags): what reads it checks it."""
