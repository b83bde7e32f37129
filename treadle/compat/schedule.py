"""pytorch-accelerated's ``scheduler_step``: the schedule stepped by a
``Trainer`` subclass's own method, where treadle steps it.

treadle's :class:`~treadle.hooks.LRScheduler` steps the schedule after every
update (or epoch, ``scheduler_interval="epoch"``) in its
:meth:`~treadle.hooks.LRScheduler.step_schedule`; a subclass that overrides
``scheduler_step`` gets the hook below, whose ``step_schedule`` calls it
there, as pytorch-accelerated calls it after its optimizer step.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from treadle.hooks import HookBase, LRScheduler

__all__ = ["SchedulerStepHook", "lr_scheduler_of"]


class SchedulerStepHook(LRScheduler):
    """An :class:`~treadle.hooks.LRScheduler` whose schedule steps by
    ``scheduler_step()`` (a ``Trainer`` subclass's override) wherever the
    hook would call ``scheduler.step()``; it publishes the rate as the hook
    does. The check that nothing else steps the schedule is the override's
    to keep: it may step it as it likes."""

    def __init__(self, *args: Any, scheduler_step: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scheduler_step = scheduler_step

    def step_schedule(self) -> None:
        self._scheduler_step()


def lr_scheduler_of(scheduler_step: Optional[Callable[[], None]]) -> Optional[Callable[..., HookBase]]:
    """The learning-rate hook for :func:`~treadle.engine.default_hooks.default_hooks`:
    :class:`SchedulerStepHook` calling ``scheduler_step``, or None (the
    default hooks' own :class:`~treadle.hooks.LRScheduler`) where there is none."""
    if scheduler_step is None:
        return None
    return functools.partial(SchedulerStepHook, scheduler_step=scheduler_step)
