"""What a subclass of the plain ``Trainer`` changes: the methods of other
trainers' names it overrides, checked when it is built, and an evaluation batch run through them.

A subclass keeps the method names of the trainer its user comes from
(:mod:`treadle.compat.names`). :class:`SeedSubclass` is the ``Trainer``'s
base that holds what reads them: ``_check_overrides`` runs once, in the
constructor, before anything is built, and refuses in one line a method
treadle never calls or one that would leave a setting unused;
``_eval_batch`` is the evaluation's batch function where a subclass
overrides a point of evaluation (pytorch-accelerated's, Hezar's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, FrozenSet, Optional

import torch

from treadle.evaluation.batch import batch_size

from treadle.compat.names import HEZAR, HUGGING_FACE, compute_loss_seed, refuse_seed_methods, schedule_step_in
from treadle.compat.events import TRAIN_EPOCH_EVENTS, SeedEventCalls, is_event_callback
from treadle.compat.overrides import SeedOverrides

from .settings import TrainerSettings

__all__ = ["SeedSubclass", "check_epoch_events"]

#: The settings that act inside treadle's update, at their defaults: a
#: subclass's ``train_step`` (qurious') does the whole update itself.
_UPDATE_DEFAULTS = {"grad_accum_steps": 1, "clip_grad_norm": None, "clip_grad_value": None, "precision": "fp32",
                    "compile": False}


class SeedSubclass(SeedOverrides):
    """The seeds' override points (:class:`~treadle.compat.overrides.SeedOverrides`)
    and what the ``Trainer`` does with a subclass's: checks, when it is
    built, and its evaluation batch."""

    #: The settings the caller passed (not as None).
    _given_settings: FrozenSet[str] = frozenset()
    #: Who is called at each event of the seeds (a subclass's methods, callbacks, hooks).
    _events: SeedEventCalls

    if TYPE_CHECKING:  # the Trainer's, which knows its own class

        def _overrides(self, name: str) -> bool: ...

        def _seed_update(self) -> bool: ...

        def train_step(self, batch: Any) -> Any: ...

    def _check_overrides(self, base: type, s: TrainerSettings) -> SeedEventCalls:
        """Refuses, in one line, a seed method this subclass (of ``base``,
        the ``Trainer``) defines that treadle never calls, or one that
        would leave a setting of ``s`` unused; records which loss the subclass
        defines; returns who is called at each event."""
        refuse_seed_methods(self, base)
        cls = type(self).__name__
        loss_seed = compute_loss_seed(self, base)
        self._hezar_compute_loss, self._hf_compute_loss = loss_seed == HEZAR, loss_seed == HUGGING_FACE
        self._own_compute_loss_override = loss_seed in ("treadle", HUGGING_FACE)
        self._loss_by_parts = any(self._overrides(n) for n in ("_prepare_batch", "_forward_pass", "_compute_loss"))
        hooks, opt = s.logging.hooks, s.optimization
        callbacks = [(c, "callbacks") for c in s.logging.callbacks if is_event_callback(c)]
        events = SeedEventCalls(self, base, callbacks + [(h, "hooks") for h in hooks])
        self._events = events
        if self._overrides("train_step"):
            for name, default in _UPDATE_DEFAULTS.items():
                if getattr(opt, name) != default:
                    raise ValueError(
                        f"{cls}.train_step does the whole update itself (qurious' contract), so {name}="
                        f"{getattr(opt, name)!r} would never act: apply it in train_step, or override "
                        "compute_loss(self, batch) and keep treadle's update")
            stepping = schedule_step_in(self.train_step)
            if stepping is not None:
                raise ValueError(f"{cls}.train_step steps the learning-rate schedule ({stepping}), which treadle's "
                                 "LRScheduler hook steps after each iteration (each epoch with scheduler_interval="
                                 "'epoch'): remove that call, and give the schedule as scheduler=")
            for hook in hooks:
                if hook.overrides("after_backward"):
                    raise ValueError(f"{cls}.train_step does the whole update itself, so {type(hook).__name__}."
                                     "after_backward would never run: call it from train_step, or override "
                                     "compute_loss(self, batch) and keep treadle's update")
        if opt.compile and self._seed_update():
            raise ValueError(f"compile={opt.compile!r} compiles treadle's loss (compute_loss), and {cls} overrides a "
                             "point of another trainer's update, which would run uncompiled: leave compile out, or "
                             "override compute_loss(self, batch) alone")
        if self._overrides("eval_step") and "metrics" in self._given_settings:
            raise ValueError(f"{cls}.eval_step computes the evaluation's results (qurious' contract), so metrics="
                             f"{list(s.evaluation.metrics)!r} would never be computed: return them from eval_step, or "
                             "give metrics without eval_step")
        if self._overrides("create_scheduler") and opt.scheduler is not None:
            raise ValueError(f"{cls}.create_scheduler builds the schedule, and scheduler={opt.scheduler!r} is given "
                             "too: give one of them")
        if self._overrides("scheduler_step") and opt.scheduler is None and not self._overrides("create_scheduler"):
            raise ValueError(f"{cls}.scheduler_step steps the schedule, and there is none: give scheduler= (or "
                             "override create_scheduler)")
        return events

    def _eval_batch(self, batch: Any) -> Any:
        """One evaluation batch through this subclass's seed methods: its
        outputs (what metrics score) and its loss."""
        if self._overrides("prepare_input_batch"):
            batch = self.prepare_input_batch(batch)
        self._events.fire("eval_step_start")
        if self._overrides("evaluation_step") and not self._overrides("calculate_eval_batch_loss"):
            outputs = self.evaluation_step(batch)
            own = getattr(outputs, "loss", None) if not isinstance(outputs, Mapping) else outputs.get("loss")
            loss = own if isinstance(own, torch.Tensor) else self._loss_of(outputs, self._prepare_batch(batch)[1])
            output: Any = {"loss": loss, "model_outputs": outputs, "batch_size": batch_size(batch)}
        else:
            output = self.calculate_eval_batch_loss(batch)
            if not isinstance(output, Mapping) or "loss" not in output:
                raise TypeError(f"{type(self).__name__}.calculate_eval_batch_loss must return a dict with a 'loss' "
                                f"(pytorch-accelerated's contract), got {type(output).__name__}")
        self._events.fire("eval_step_end", batch=batch, batch_output=output)
        return output.get("model_outputs"), output["loss"]


def check_epoch_events(events: SeedEventCalls, epoch_length: Optional[int]) -> None:
    """Refuses pytorch-accelerated's epoch events where the data has no length (no epochs)."""
    for event in TRAIN_EPOCH_EVENTS:
        if event in events and not epoch_length:
            raise ValueError(f"{event} is called at each epoch's end (pytorch-accelerated's event), and this "
                             "train_loader has no length (no epochs): give data with a length, or use a hook's "
                             "after_step with a period")
