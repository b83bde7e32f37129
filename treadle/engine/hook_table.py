"""Which hooks run at each stage of the loop, in which order, and the time each took.

The one ordering rule lives here: hooks are called in the order of the hook
list, constrained only by the dependencies hook classes declare
(:attr:`HookBase.runs_after`), checked once at registration; a periodic
hook's ``after_step`` runs at the iterations its
:meth:`HookBase.after_step_period` declares and nowhere else.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

from treadle.hooks.base import HOOK_STAGES, HookBase

__all__ = ["HookOrderError", "HookTable", "note_origin"]

# An iteration no training reaches.
_NEVER = 2**62


class HookOrderError(ValueError):
    """Hooks were registered in an order that would make one of them mis-run."""


class HookCall(NamedTuple):
    """One hook's method at one stage, with the key its time is counted under
    (``hook`` is None for a task asked for by a hook, see ``at_iteration_end``)."""

    hook: Optional[HookBase]
    method: Callable[[], None]
    key: str  # "ClassName.stage"


class HookTable:
    """The registered hooks, their calls by stage, and the time each took.

    Built once per registration: bound methods and timing keys are made here
    rather than at every call, since the loop calls them every iteration.
    """

    def __init__(self) -> None:
        self.hooks: List[HookBase] = []
        self.calls: Dict[str, List[HookCall]] = {stage: [] for stage in HOOK_STAGES}
        # Seconds spent in each "Hook.stage" (and in iteration-end tasks).
        self.seconds: Dict[str, float] = defaultdict(float)
        # The after_step schedule of the current training (see plan_after_step).
        self._periods: Dict[int, int] = {}
        self._every_iteration: List[HookCall] = []
        self._next_due = _NEVER
        self._last_iter = _NEVER

    # ------------------------------------------------------------------ registration
    def register(self, hooks: Sequence[Optional[HookBase]]) -> List[HookBase]:
        """Appends ``hooks`` (``None`` skipped) after checking types and order;
        returns the ones added.

        Raises:
            TypeError: an entry is not a :class:`HookBase`.
            HookOrderError: a hook would run before a hook it must follow.
        """
        added = [h for h in hooks if h is not None]
        for h in added:
            if not isinstance(h, HookBase):
                raise TypeError(f"Hooks must be HookBase instances, got {type(h).__name__}: {h!r}")
        candidate = self.hooks + added
        check_order(candidate)
        self.hooks = candidate
        for h in candidate:
            declared = (*h.runs_after, *h.uses)
            # Resolved here, once, for HookBase.hooks_of.
            h.__dict__["_registered_peers"] = [p for p in candidate if p is not h and isinstance(p, declared)] if declared else []
        self.calls = {
            stage: [HookCall(h, getattr(h, stage), f"{type(h).__name__}.{stage}") for h in candidate if h.overrides(stage)]
            for stage in HOOK_STAGES
        }
        # A hook registered during training: its after_step runs every iteration.
        self._every_iteration = [c for c in self.calls["after_step"] if id(c.hook) not in self._periods]
        return added

    def plan_after_step(self, start_iter: int, max_iter: int) -> None:
        """Asks each hook's :meth:`~HookBase.after_step_period`, for a training
        of iterations ``start_iter .. max_iter - 1`` (after every ``before_train``)."""
        self._periods = {}
        for call in self.calls["after_step"]:
            assert call.hook is not None  # the stages' calls are hooks'
            period = call.hook.after_step_period()
            if period is not None:
                self._periods[id(call.hook)] = max(int(period), 0)
        self._every_iteration = [c for c in self.calls["after_step"] if id(c.hook) not in self._periods]
        self._last_iter = max_iter - 1
        self._next_due = self._next_due_after(start_iter - 1)

    def forget_plan(self) -> None:
        """Outside training, ``after_step`` runs every hook's (as detectron2's does)."""
        self._periods = {}
        self._every_iteration = self.calls["after_step"]
        self._next_due = self._last_iter = _NEVER

    # ------------------------------------------------------------------ calls
    def after_step_calls(self, iteration: int) -> List[HookCall]:
        """The ``after_step`` calls due after ``iteration``, in hook order."""
        if iteration < self._next_due:
            return self._every_iteration
        self._next_due = self._next_due_after(iteration)
        periods = self._periods
        return [c for c in self.calls["after_step"] if id(c.hook) not in periods or self._due(periods[id(c.hook)], iteration)]

    def _due(self, period: int, iteration: int) -> bool:
        return iteration == self._last_iter or (period > 0 and (iteration + 1) % period == 0)

    def _next_due_after(self, iteration: int) -> int:
        """The first iteration after ``iteration`` where a periodic hook is due."""
        if not self._periods:
            return _NEVER
        due = self._last_iter if self._last_iter > iteration else _NEVER
        for period in self._periods.values():
            if period > 0:
                due = min(due, ((iteration + 1) // period + 1) * period - 1)
        return due

    def run(self, calls: List[HookCall], iteration: int) -> None:
        """Calls each of ``calls`` in order and counts its time.

        One clock read per call: each call's end is the next one's start.
        """
        if not calls:
            return
        seconds = self.seconds
        clock = time.perf_counter
        start = clock()
        for call in calls:
            try:
                call.method()
            except (Exception, KeyboardInterrupt) as e:
                note_origin(e, f"hook {call.key} at iteration {iteration}")
                raise
            end = clock()
            seconds[call.key] += end - start
            start = end


def check_order(hooks: Sequence[HookBase]) -> None:
    """Raises :class:`HookOrderError` where a hook comes before one it must follow."""
    for i, h in enumerate(hooks):
        for required in h.runs_after:
            if any(isinstance(later, required) for later in hooks[i + 1 :]):
                order = ", ".join(type(x).__name__ for x in hooks)
                reason = h.order_reason or f"it reads what {required.__name__} produces"
                raise HookOrderError(
                    f"{type(h).__name__} must be registered after {required.__name__}: {reason}. "
                    f"Got the order [{order}]."
                )


def note_origin(error: BaseException, where: str) -> None:
    """Records where in the loop ``error`` was raised, once (the innermost place wins).

    Kept as ``error.treadle_origin`` for one-line reports (``tools/train_net.py``
    prints it), and as a note that Python shows under the traceback.
    """
    if getattr(error, "treadle_origin", None):
        return
    try:
        error.treadle_origin = where  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__
        return
    if hasattr(error, "add_note"):  # Python >= 3.11
        error.add_note(f"treadle: raised by {where}")
