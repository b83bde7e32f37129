"""Which hooks run at each stage of the loop, in which order, and the time each took.

The one ordering rule lives here: hooks are called in the order of the hook
list, constrained only by the dependencies hook classes declare
(:attr:`HookBase.runs_after`), checked once at registration; a periodic
hook's ``after_step`` and ``after_iteration`` run at the iterations its
:meth:`HookBase.after_step_period` and :meth:`HookBase.after_iteration_period`
declare (the last one where :attr:`HookBase.runs_at_last_iteration`), and
nowhere else. Two hooks that declare one scalar name
(:meth:`HookBase.scalar_names`) are refused at registration too.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from typing import Any, Callable, Collection, Dict, List, NamedTuple, Optional, Sequence, Tuple

from treadle.hooks.base import HOOK_STAGES, HookBase

from .hook_methods import check_hook_methods
from .trainer_state import hook_state_keys

__all__ = ["HookOrderError", "HookTable", "HookCall", "PERIODIC_STAGES", "check_scalar_names", "note_origin",
           "call_noted", "callable_name"]

# An iteration no training reaches.
_NEVER = 2**62


class HookOrderError(ValueError):
    """Hooks were registered in an order that would make one of them mis-run."""


class HookCall(NamedTuple):
    """One hook's method at one stage, with the key its time is counted under."""

    hook: HookBase
    method: Callable[[], None]
    key: str  # "ClassName.stage"


#: The stages that run at the periods hooks declare, with the method that declares each.
PERIODIC_STAGES: Dict[str, str] = {"after_step": "after_step_period", "after_iteration": "after_iteration_period"}


class Schedule:
    """When one periodic stage's calls are due, over one training: a hook
    with period ``N`` after iterations ``N - 1``, ``2N - 1``, ..., and after
    the last where it runs at the last iteration; a hook without a period
    after every iteration.

    Between two iterations where some periodic hook is due, the calls are
    the every-iteration ones, kept in one list: the loop asks every
    iteration, and most iterations need no arithmetic."""

    def __init__(self, calls: List[HookCall]) -> None:
        self.calls = calls
        self.periods: Dict[int, Tuple[int, bool]] = {}  # id(hook) -> (period, at the last iteration)
        self.every_iteration = calls
        self.next_due = _NEVER
        self.last_iter = _NEVER

    def plan(self, period_of: str, start_iter: int, max_iter: int) -> None:
        self.periods = {}
        for call in self.calls:
            period = getattr(call.hook, period_of)()
            if period is not None:
                self.periods[id(call.hook)] = (max(int(period), 0), bool(call.hook.runs_at_last_iteration))
        self.every_iteration = [c for c in self.calls if id(c.hook) not in self.periods]
        self.last_iter = max_iter - 1
        self.next_due = self._next_due_after(start_iter - 1)

    def forget(self) -> None:
        self.periods, self.every_iteration = {}, self.calls
        self.next_due = self.last_iter = _NEVER

    def due(self, iteration: int) -> List[HookCall]:
        if iteration < self.next_due:
            return self.every_iteration
        self.next_due = self._next_due_after(iteration)
        periods = self.periods
        return [c for c in self.calls if id(c.hook) not in periods or self._due(periods[id(c.hook)], iteration)]

    def _due(self, period: Tuple[int, bool], iteration: int) -> bool:
        every, at_last = period
        if iteration == self.last_iter:
            return at_last
        return every > 0 and (iteration + 1) % every == 0

    def _next_due_after(self, iteration: int) -> int:
        """The first iteration after ``iteration`` where a periodic hook may be due."""
        if not self.periods:
            return _NEVER
        due = self.last_iter if self.last_iter > iteration else _NEVER
        for every, _ in self.periods.values():
            if every > 0:
                due = min(due, ((iteration + 1) // every + 1) * every - 1)
        return due


class HookTable:
    """The registered hooks, their calls by stage, and the time each took.

    Built once per registration: bound methods and timing keys are made here
    rather than at every call, since the loop calls them every iteration.
    """

    def __init__(self) -> None:
        self.hooks: List[HookBase] = []
        self.calls: Dict[str, List[HookCall]] = {stage: [] for stage in HOOK_STAGES}
        # Seconds spent in each "Hook.stage".
        self.seconds: Dict[str, float] = defaultdict(float)
        # When the periodic stages' calls are due in the current training (see plan_periods);
        # an attribute each, read by the loop every iteration.
        self.after_step_schedule = Schedule([])
        self.after_iteration_schedule = Schedule([])
        self.schedules: Dict[str, Schedule] = {
            "after_step": self.after_step_schedule, "after_iteration": self.after_iteration_schedule
        }

    # ------------------------------------------------------------------ registration
    def register(self, hooks: Sequence[Optional[HookBase]],
                 also_called: Callable[[HookBase], Collection[str]] = lambda hook: ()) -> List[HookBase]:
        """Appends ``hooks`` (``None`` skipped) after checking types, methods
        and order; returns the ones added. ``also_called(hook)``: the methods
        of ``hook`` the trainer calls besides the stages.

        Raises:
            TypeError: an entry is not a :class:`HookBase`; it has a public
                method named like a stage that is none, or a stage that
                cannot be called with no argument (:func:`check_hook_methods`).
            HookOrderError: a hook would run before a hook it must follow.
            ValueError: two hooks declare one scalar name (:func:`check_scalar_names`).
        """
        added = [h for h in hooks if h is not None]
        for h in added:
            if not isinstance(h, HookBase):
                raise TypeError(f"Hooks must be HookBase instances, got {type(h).__name__}: {h!r}")
            check_hook_methods(h, also_called(h))
        candidate = self.hooks + added
        check_order(candidate)
        check_scalar_names(candidate)
        self.hooks = candidate
        for h in candidate:
            declared = (*h.runs_after, *h.uses)
            h.attach_peers([p for p in candidate if p is not h and isinstance(p, declared)] if declared else [])
        self.calls = {
            stage: [HookCall(h, getattr(h, stage), f"{type(h).__name__}.{stage}") for h in candidate if h.overrides(stage)]
            for stage in HOOK_STAGES
        }
        for stage, schedule in self.schedules.items():
            # A hook registered during training: its periodic stages run every iteration.
            periods = schedule.periods
            schedule.calls = self.calls[stage]
            schedule.every_iteration = [c for c in schedule.calls if id(c.hook) not in periods]
        return added

    def plan_periods(self, start_iter: int, max_iter: int) -> None:
        """Asks each hook's periods (:meth:`~HookBase.after_step_period`,
        :meth:`~HookBase.after_iteration_period`), for a training of iterations
        ``start_iter .. max_iter - 1`` (after every ``before_train``)."""
        for stage, schedule in self.schedules.items():
            schedule.plan(PERIODIC_STAGES[stage], start_iter, max_iter)

    def forget_plan(self) -> None:
        """Outside training, a periodic stage runs every hook's (as detectron2's ``after_step`` does)."""
        for schedule in self.schedules.values():
            schedule.forget()

    # ------------------------------------------------------------------ calls
    def due(self, stage: str, iteration: int) -> List[HookCall]:
        """The calls of a periodic ``stage`` due after ``iteration``, in hook order."""
        return self.schedules[stage].due(iteration)

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
                note_origin(e, f"hook {call.key}", iteration)
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


def check_scalar_names(hooks: Sequence[HookBase]) -> None:
    """Raises ``ValueError`` where two hooks declare one scalar name
    (:meth:`HookBase.scalar_names`), naming both by their state keys."""
    producers: Dict[str, str] = {}  # name -> the key of the first hook declaring it
    for key, h in hook_state_keys(hooks).items():
        for name in h.scalar_names():
            first = producers.setdefault(name, key)
            if first == key:
                continue
            hint = h.rename_hint or "give each its own name, or register one of them"
            raise ValueError(
                f"{first} and {key} both publish the scalar {name!r}: writers keep one value per name "
                f"and iteration, so one of the two would be lost; {hint}"
            )


def note_origin(error: BaseException, where: Optional[str], iteration: int) -> None:
    """Records where in the loop ``error`` was raised, once (the innermost place wins):
    ``"{where} at iteration {iteration}"`` (``"iteration {iteration}"`` without
    a ``where``), where the user's function that a hook or the step called
    (:func:`call_noted`) replaces ``where``: the report names the callback
    that failed, not the hook that called it.

    Kept as ``error.treadle_origin`` for one-line reports (``tools/train_net.py``
    prints it), and as a note that Python shows under the traceback.
    """
    if getattr(error, "treadle_origin", None):
        return
    where = getattr(error, "treadle_called", None) or where
    origin = f"{where} at iteration {iteration}" if where else f"iteration {iteration}"
    try:
        error.treadle_origin = origin  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__
        return
    if hasattr(error, "add_note"):  # Python >= 3.11
        error.add_note(f"treadle: raised by {origin}")


def call_noted(fn: Callable[..., Any], name: str, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; an ``Exception`` it raises is noted as raised
    by ``name`` (a callback: ``"callback log_metrics"``) for :func:`note_origin`,
    unless a function it called was noted already (the innermost wins)."""
    try:
        return fn(*args, **kwargs)
    except Exception as error:
        if not getattr(error, "treadle_called", None):
            try:
                error.treadle_called = name  # type: ignore[attr-defined]
            except AttributeError:  # an exception type without a __dict__
                pass
        raise


def callable_name(fn: Any) -> str:
    """How a report names ``fn``: ``log_metrics``, ``MyCallback.on_train_epoch_end``
    (a bound method), ``Scorer`` (an object with ``__call__``); a function
    defined inside another is named without the enclosing one's
    ``<locals>`` path, a ``functools.partial`` by its function."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None)
    if not isinstance(name, str):
        name = type(fn).__qualname__
    return name.rsplit("<locals>.", 1)[-1]
