"""pytorch-accelerated's events, called where its loop calls them: who is
called at each event (:class:`SeedEventCalls`: the ``Trainer`` subclass's
methods of the event's name, then each callback's ``on_<event>``), and the
hooks that call them at the loop's stages (:class:`TrainEvents`,
:class:`RunEvents`), which the plain ``Trainer`` registers where an event is
given."""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from treadle.engine.hook_table import call_noted, callable_name
from treadle.hooks.base import HookBase

from .names import event_methods, overridden

__all__ = ["SeedEventCalls", "TrainEvents", "RunEvents", "is_event_callback", "TRAIN_EPOCH_EVENTS"]

#: pytorch-accelerated's events that need epochs.
TRAIN_EPOCH_EVENTS = ("train_epoch_start", "train_epoch_end", "training_run_epoch_end")
#: pytorch-accelerated's events, in the order of its loop; the ``Trainer``'s
#: methods of these names are called with no argument, a callback's
#: ``on_<event>`` with the trainer.
_TRAINER_EVENTS = ("training_run_start", "train_epoch_start", "train_epoch_end", "eval_epoch_start",
                   "eval_epoch_end", "training_run_epoch_end", "training_run_end", "evaluation_run_start",
                   "evaluation_run_end")


class SeedEventCalls:
    """Who is called at each event (:data:`~treadle.compat.names.CALLBACK_EVENTS`):
    the ``Trainer`` subclass's methods of the event's name, then each
    callback's ``on_<event>(trainer, **kwargs)``, in the order given. A
    failure in one is reported by its own name (``MyTrainer.train_epoch_end``,
    ``callback MyCallback.on_train_epoch_end``), not by the hook or the step
    that fired the event."""

    def __init__(self, trainer: Any = None, base: type = object, callbacks: Sequence[Tuple[Any, str]] = ()) -> None:
        self.calls: Dict[str, List[Callable[..., Any]]] = collections.defaultdict(list)
        for event in _TRAINER_EVENTS if trainer is not None else ():
            if overridden(trainer, event, base):
                self.calls[event].append(_trainer_method(getattr(trainer, event)))
        for callback, where in callbacks:
            for event, method in event_methods(callback, where).items():
                self.calls[event].append(_callback_method(method, trainer))

    def __contains__(self, event: object) -> bool:
        return bool(self.calls.get(event)) if isinstance(event, str) else False

    def fire(self, event: str, **kwargs: Any) -> None:
        for call in self.calls.get(event, ()):
            call(**kwargs)


def _trainer_method(method: Callable[[], Any]) -> Callable[..., Any]:
    """A ``Trainer`` subclass's event method, called with no argument, a failure named ``MyTrainer.event``."""
    name = callable_name(method)

    def call(**kwargs: Any) -> Any:
        return call_noted(method, name)
    return call


def _callback_method(method: Callable[..., Any], trainer: Any) -> Callable[..., Any]:
    """A callback's ``on_<event>``, called with the trainer, a failure named ``callback MyCallback.on_<event>``."""
    name = f"callback {callable_name(method)}"

    def call(**kwargs: Any) -> Any:
        return call_noted(method, name, trainer, **kwargs)
    return call


def is_event_callback(obj: Any) -> bool:
    """Whether ``obj`` (an entry of ``callbacks=``) is a callback object with
    ``on_*`` events (pytorch-accelerated's) rather than ``fn(trainer, epoch, metrics)``."""
    return not callable(obj) and any(name.startswith("on_") for name in dir(type(obj)))


class _EventHook(HookBase):
    """A hook calling pytorch-accelerated's events at the stages of ``STAGES``
    (stage: event); a stage none of whose events is given is not called."""

    STAGES: Dict[str, str] = {}

    def __init__(self, events: SeedEventCalls) -> None:
        self.events = events

    def overrides(self, stage: str) -> bool:
        return self.STAGES.get(stage, "") in self.events

    def active(self) -> bool:
        """Whether any of its events is given (otherwise it is not registered)."""
        return any(event in self.events for event in self.STAGES.values())


class TrainEvents(_EventHook):
    """Calls pytorch-accelerated's training events: ``training_run_start``
    before training, ``train_epoch_start`` when each epoch begins, and
    ``train_epoch_end`` after each epoch's last iteration (and the run's),
    before its evaluation: its ``after_step`` declares the epoch as its
    period. Registered before the ``EvalHook``."""

    STAGES = {"before_train": "training_run_start", "before_epoch": "train_epoch_start",
              "after_step": "train_epoch_end"}

    def before_train(self) -> None:
        self.events.fire("training_run_start")

    def before_epoch(self) -> None:
        self.events.fire("train_epoch_start")

    def after_step_period(self) -> Optional[int]:
        return self.trainer.epoch_length or 0

    def after_step(self) -> None:
        self.events.fire("train_epoch_end")


class RunEvents(_EventHook):
    """Calls pytorch-accelerated's ``training_run_epoch_end`` at each epoch's
    end (after its evaluation) and ``training_run_end`` when training ends.
    Registered after the ``EvalHook`` and the epoch's history."""

    STAGES = {"after_epoch": "training_run_epoch_end", "after_train": "training_run_end"}

    def after_epoch(self) -> None:
        self.events.fire("training_run_epoch_end")

    def after_train(self) -> None:
        if self.trainer.training_error is None:
            self.events.fire("training_run_end")
