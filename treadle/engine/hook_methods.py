"""Which methods of a hook the loop calls, checked when the hook is registered.

A hook written for another framework names its methods after that
framework's stages (``before_train_iter``, ``after_val_epoch``,
``on_train_batch_end``...) or gives treadle's stages that framework's
arguments (``before_train(self, runner)``): the first would never be
called, the second would fail at its first call, after the run's files are
written. Both are refused in one line when the hook is registered
(:func:`check_hook_methods`). The rule knows no framework's names: a
public method named like a stage (``before_*``, ``after_*``, ``on_*``) is a
stage, one the trainer calls otherwise (a trainer names those,
:meth:`~treadle.engine.TrainerBase.hook_methods_called`), or refused.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Collection, Optional, Tuple

from treadle.hooks.base import HOOK_STAGES, HookBase

__all__ = ["check_hook_methods", "stray_method", "stage_for", "STAGE_LIKE_PREFIXES"]

#: The prefixes that make a method's name look like a stage's.
STAGE_LIKE_PREFIXES: Tuple[str, ...] = ("before_", "after_", "on_")

# When a name's stage runs, by its words: on_<what>_start is before <what>.
_WHEN = {"before": "before", "after": "after", "start": "before", "begin": "before", "end": "after"}
# What a name's stage is around, by the first word that says it (a prefix: "iters", "epochs").
_WHAT = (("backward", "backward"), ("epoch", "epoch"), ("iter", "step"), ("step", "step"), ("batch", "step"),
         ("train", "train"), ("run", "train"), ("fit", "train"))


def stage_for(name: str) -> str:
    """The stage a method named like one most likely means: by when it runs
    (``before``/``after``, ``start``/``begin``/``end``) and what it is
    around (an epoch; an iteration, step or batch; the backward; the
    training or run), else the stage closest by spelling."""
    words = name.split("_")
    when = _WHEN.get(words[0]) if words[0] != "on" else _WHEN.get(words[-1])
    what = next((stage for prefix, stage in _WHAT if any(word.startswith(prefix) for word in words[1:])), None)
    if when is not None and what is not None and f"{when}_{what}" in HOOK_STAGES:
        return f"{when}_{what}"
    stages = [s for s in HOOK_STAGES if what is None and when is not None and s.startswith(when)] or HOOK_STAGES
    return difflib.get_close_matches(name, stages, n=1, cutoff=0.0)[0]


def stray_method(cls: type, also_called: Collection[str] = ()) -> Optional[str]:
    """The first public method of hook class ``cls`` named like a stage that
    is neither a stage, a method of :class:`HookBase`, nor one of
    ``also_called``; None where there is none."""
    for name in dir(cls):
        if (name.startswith(STAGE_LIKE_PREFIXES) and name not in HOOK_STAGES and not hasattr(HookBase, name)
                and name not in also_called and callable(getattr(cls, name, None))):
            return name
    return None


def check_hook_methods(hook: HookBase, also_called: Collection[str] = ()) -> None:
    """Refuses, in one line, a public method of ``hook`` named like a stage
    that is none (:func:`stray_method`; ``also_called``: what the trainer
    calls besides the stages), and a stage the hook overrides that cannot be
    called with no argument."""
    cls = type(hook).__name__
    name = stray_method(type(hook), also_called)
    if name is not None:
        raise TypeError(f"{cls}.{name} is not a hook stage, so the trainer would never call it: override "
                        f"{stage_for(name)} (the stages: {', '.join(HOOK_STAGES)}), or name a helper of your own "
                        f"without {name.split('_')[0]}_ (_{name})")
    for stage in HOOK_STAGES:
        if hook.overrides(stage):
            signature = _unbindable(getattr(hook, stage))
            if signature is not None:
                raise TypeError(f"{cls}.{stage}{signature} takes arguments, and the trainer calls {stage}() with "
                                "none: read the trainer as self.trainer, the rest from it (docs/engine.md)")


def _unbindable(method: object) -> Optional[inspect.Signature]:
    """The signature of ``method`` where it cannot be called with no argument."""
    try:
        signature = inspect.signature(method)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a signature that cannot be read: called as it is
        return None
    try:
        signature.bind()
    except TypeError:
        return signature
    return None
