"""What a subclass of the plain ``Trainer`` changes: the seeds' methods it
overrides, checked when it is built, and an evaluation batch run through them.

A subclass keeps the method names of the trainer its user comes from
(:mod:`treadle.compat.names`); :func:`check_overrides` runs once, in the
``Trainer``'s constructor, before anything is built, and refuses in one line
a method treadle never calls or one that would leave a setting unused.
:func:`seed_eval_batch` is the evaluation's batch function where a subclass
overrides a point of evaluation (pytorch-accelerated's, Hezar's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

import torch

from treadle.evaluation.batch import batch_size

from treadle.compat.names import HEZAR, HUGGING_FACE, compute_loss_seed, refuse_seed_methods
from treadle.compat.overrides import TRAIN_EPOCH_EVENTS, SeedEventCalls, is_event_callback

from .settings import TrainerSettings

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["check_overrides", "check_epoch_events", "seed_eval_batch"]

#: The settings that act inside treadle's update, at their defaults: a
#: subclass's ``train_step`` (qurious') does the whole update itself.
_UPDATE_DEFAULTS = {"grad_accum_steps": 1, "clip_grad_norm": None, "clip_grad_value": None, "precision": "fp32",
                    "compile": False}


def check_overrides(trainer: Trainer, base: type, s: TrainerSettings) -> SeedEventCalls:
    """Refuses, in one line, a seed method ``trainer``'s subclass (of
    ``base``, the ``Trainer``) defines that treadle never calls, or one that
    would leave a setting of ``s`` unused; records which loss the subclass
    defines; returns who is called at each event."""
    refuse_seed_methods(trainer, base)
    cls = type(trainer).__name__
    loss_seed = compute_loss_seed(trainer, base)
    trainer._hezar_compute_loss, trainer._hf_compute_loss = loss_seed == HEZAR, loss_seed == HUGGING_FACE
    trainer._own_compute_loss_override = loss_seed in ("treadle", HUGGING_FACE)
    trainer._loss_by_parts = any(trainer._overrides(n) for n in ("_prepare_batch", "_forward_pass", "_compute_loss"))
    hooks, opt = s.logging.hooks, s.optimization
    callbacks = [(c, "callbacks") for c in s.logging.callbacks if is_event_callback(c)]
    events = SeedEventCalls(trainer, base, callbacks + [(h, "hooks") for h in hooks])
    trainer._events = events
    if trainer._overrides("train_step"):
        for name, default in _UPDATE_DEFAULTS.items():
            if getattr(opt, name) != default:
                raise ValueError(
                    f"{cls}.train_step does the whole update itself (qurious' contract), so {name}="
                    f"{getattr(opt, name)!r} would never act: apply it in train_step, or override "
                    "compute_loss(self, batch) and keep treadle's update")
        for hook in hooks:
            if hook.overrides("after_backward"):
                raise ValueError(f"{cls}.train_step does the whole update itself, so {type(hook).__name__}."
                                 "after_backward would never run: call it from train_step, or override "
                                 "compute_loss(self, batch) and keep treadle's update")
    if opt.compile and trainer._seed_update():
        raise ValueError(f"compile={opt.compile!r} compiles treadle's loss (compute_loss), and {cls} overrides a "
                         "seed's point of the update, which would run uncompiled: leave compile out, or "
                         "override compute_loss(self, batch) alone")
    if trainer._overrides("eval_step") and "metrics" in trainer._given_settings:
        raise ValueError(f"{cls}.eval_step computes the evaluation's results (qurious' contract), so metrics="
                         f"{list(s.evaluation.metrics)!r} would never be computed: return them from eval_step, or "
                         "give metrics without eval_step")
    if trainer._overrides("create_scheduler") and opt.scheduler is not None:
        raise ValueError(f"{cls}.create_scheduler builds the schedule, and scheduler={opt.scheduler!r} is given "
                         "too: give one of them")
    if trainer._overrides("scheduler_step") and opt.scheduler is None and not trainer._overrides("create_scheduler"):
        raise ValueError(f"{cls}.scheduler_step steps the schedule, and there is none: give scheduler= (or "
                         "override create_scheduler)")
    return events


def check_epoch_events(events: SeedEventCalls, epoch_length: Optional[int]) -> None:
    """Refuses pytorch-accelerated's epoch events where the data has no length (no epochs)."""
    for event in TRAIN_EPOCH_EVENTS:
        if event in events and not epoch_length:
            raise ValueError(f"{event} is called at each epoch's end (pytorch-accelerated's event), and this "
                             "train_loader has no length (no epochs): give data with a length, or use a hook's "
                             "after_step with a period")


def seed_eval_batch(trainer: Trainer, batch: Any) -> Any:
    """One evaluation batch through ``trainer``'s subclass's seed methods: its
    outputs (what metrics score) and its loss."""
    if trainer._overrides("prepare_input_batch"):
        batch = trainer.prepare_input_batch(batch)
    trainer._events.fire("eval_step_start")
    if trainer._overrides("evaluation_step") and not trainer._overrides("calculate_eval_batch_loss"):
        outputs = trainer.evaluation_step(batch)
        own = getattr(outputs, "loss", None) if not isinstance(outputs, Mapping) else outputs.get("loss")
        loss = own if isinstance(own, torch.Tensor) else trainer._loss_of(outputs, trainer._prepare_batch(batch)[1])
        output: Any = {"loss": loss, "model_outputs": outputs, "batch_size": batch_size(batch)}
    else:
        output = trainer.calculate_eval_batch_loss(batch)
        if not isinstance(output, Mapping) or "loss" not in output:
            raise TypeError(f"{type(trainer).__name__}.calculate_eval_batch_loss must return a dict with a 'loss' "
                            f"(pytorch-accelerated's contract), got {type(output).__name__}")
    trainer._events.fire("eval_step_end", batch=batch, batch_output=output)
    return output.get("model_outputs"), output["loss"]
