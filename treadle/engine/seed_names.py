"""The seeds' override points: one table of every method the trainers
treadle's users come from document as overridable, with treadle's answer.

A user of qurious, pytorch-accelerated, Hezar or LiBai subclasses the
trainer and overrides the method their trainer calls (``train_step``,
``calculate_train_batch_loss``, ``prepare_input_batch``...), or writes a
callback with pytorch-accelerated's event names (``on_train_epoch_end``).
Each name here is either

- **called**: the plain :class:`~treadle.engine.Trainer` (or
  ``DefaultTrainer``, or a hook's callback) calls it at the seed's moment
  with the seed's arguments and return contract; treadle's own update,
  resume, hooks and processes stay around it; or
- **refused**: a subclass (or a hook, a callback, a step) that defines it is
  refused when it is built, in one line naming what to write in treadle.

Nothing a seed documents is defined and left unused. ``docs/migrating.md``
shows this table (:func:`override_rows`), and a test walks it.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = [
    "OverridePoint",
    "OVERRIDE_POINTS",
    "SEED_METHODS",
    "CALLBACK_EVENTS",
    "overridden",
    "refuse_seed_methods",
    "event_methods",
    "override_rows",
    "render_markdown",
    "write_markdown",
    "required_positional",
    "refusal",
]

QURIOUS, ACCELERATED, HEZAR, LIBAI, LIGHTNING = "qurious", "pytorch-accelerated", "Hezar", "LiBai", "Lightning"


@dataclasses.dataclass(frozen=True)
class OverridePoint:
    """One method a seed documents as overridable, and what treadle does with it.

    Attributes:
        name: the method's name, as the seed spells it.
        seed: whose name it is (``"qurious"``, ``"pytorch-accelerated"``...).
        on: where it is defined: ``"Trainer"`` (a subclass of the plain
            ``Trainer``), ``"DefaultTrainer"``, ``"callback"`` (a hook or a
            callback object given to the ``Trainer``) or ``"step"`` (a step object).
        called: True: treadle calls it; False: a definition is refused.
        treadle: when and how it is called; for a refused name, what to
            write instead (the refusal's words).
    """

    name: str
    seed: str
    on: str
    called: bool
    treadle: str


def _called(name: str, seed: str, when: str, on: str = "Trainer") -> OverridePoint:
    return OverridePoint(name, seed, on, True, when)


def _refused(name: str, seed: str, instead: str, on: str = "Trainer") -> OverridePoint:
    return OverridePoint(name, seed, on, False, instead)


_LOOP = "treadle's loop trains by iterations (TrainerBase): "
_DATA = "give the Trainer a DataLoader (train_loader=, eval_loader=), which it iterates as given"

#: The table: every override point the seeds document, called or refused.
OVERRIDE_POINTS: Tuple[OverridePoint, ...] = (
    # ------------------------------------------------------------ qurious
    _called("train_step", QURIOUS, "train_step(batch) -> {'loss': float, ...}: the whole update of one batch (on "
            "the device), once per iteration of train() and train_epoch(); the floats returned are published "
            "('loss' as total_loss). Settings that act inside treadle's update (grad_accum_steps, clip_grad_*, "
            "precision, compile) are refused with it"),
    _called("eval_step", QURIOUS, "eval_step(batch) -> {name: float}: every evaluation batch (on the device, eval "
            "mode, no grad); the evaluation's results are each value's mean over the batches (metrics= is "
            "refused with it)"),
    _called("evaluate", QURIOUS, "evaluate(dataloader) -> {name: float}: each evaluation of training, with the "
            "eval_loader; the model's train mode is restored after it"),
    _called("_prepare_batch", QURIOUS, "_prepare_batch(batch) -> (inputs, targets), the batch on the device: "
            "first of every batch's loss, in training and evaluation"),
    _called("_forward_pass", QURIOUS, "_forward_pass(inputs) -> outputs: the model's forward of every batch"),
    _called("_compute_loss", QURIOUS, "_compute_loss(outputs, targets) -> loss tensor: every batch's loss"),
    _refused("train_epoch", QURIOUS, _LOOP + "train() does not call train_epoch(); put per-epoch work in "
             "callbacks=[fn(trainer, epoch, metrics)] or a hook's after_epoch"),
    _refused("_save_checkpoint", QURIOUS, "treadle writes its checkpoints itself (atomic, with the state an exact "
             "resume needs); add values with save_checkpoint(path, **extra) or a hook's state_dict()"),
    # ------------------------------------------------------------ pytorch-accelerated
    _called("calculate_train_batch_loss", ACCELERATED, "calculate_train_batch_loss(batch) -> {'loss', "
            "'model_outputs', 'batch_size'}: every training batch (micro-batch), its 'loss' backpropagated"),
    _called("calculate_eval_batch_loss", ACCELERATED, "calculate_eval_batch_loss(batch) -> {'loss', "
            "'model_outputs', 'batch_size'}: every evaluation batch; 'loss' is the evaluation loss, "
            "'model_outputs' what metrics= score"),
    _called("backward_step", ACCELERATED, "backward_step(loss): every batch's backward (the loss divided by "
            "grad_accum_steps)"),
    _called("optimizer_step", ACCELERATED, "optimizer_step(): once per update, after the gradients are unscaled "
            "and clipped"),
    _called("scheduler_step", ACCELERATED, "scheduler_step(): wherever the schedule steps (after each update, or "
            "each epoch with scheduler_interval='epoch'); refused without a scheduler"),
    _called("optimizer_zero_grad", ACCELERATED, "optimizer_zero_grad(): once per update, before its first "
            "backward (pytorch-accelerated zeroes after the step: the gradients are the same)"),
    _called("create_scheduler", ACCELERATED, "create_scheduler() -> scheduler: once, when the Trainer is built, "
            "after the optimizer (self.optimizer); refused with scheduler="),
    _called("training_run_start", ACCELERATED, "training_run_start(): when train() starts"),
    _called("train_epoch_start", ACCELERATED, "train_epoch_start(): before each epoch's first update"),
    _called("train_epoch_end", ACCELERATED, "train_epoch_end(): after each epoch's last update, before its "
            "evaluation"),
    _called("eval_epoch_start", ACCELERATED, "eval_epoch_start(): before each evaluation's first batch"),
    _called("eval_epoch_end", ACCELERATED, "eval_epoch_end(): after each evaluation's last batch"),
    _called("training_run_epoch_end", ACCELERATED, "training_run_epoch_end(): at each epoch's end, after its "
            "evaluation"),
    _called("training_run_end", ACCELERATED, "training_run_end(): when training ends"),
    _called("evaluation_run_start", ACCELERATED, "evaluation_run_start(): when evaluate() is called outside "
            "training"),
    _called("evaluation_run_end", ACCELERATED, "evaluation_run_end(): when such an evaluate() ends"),
    _refused("create_train_dataloader", ACCELERATED + " and " + HEZAR, _DATA),
    _refused("create_eval_dataloader", ACCELERATED + " and " + HEZAR, _DATA),
    _refused("get_default_train_dl_kwargs", ACCELERATED, _DATA),
    _refused("get_default_eval_dl_kwargs", ACCELERATED, _DATA),
    _refused("_prepare_model_and_optimizer", ACCELERATED, "the Trainer places and wraps the model itself "
             "(device=, ddp=); override build_model(model, settings) to change it"),
    _refused("_prepare_dataloaders", ACCELERATED, _DATA),
    _refused("_create_run_config", ACCELERATED, "the run's settings are the Trainer's arguments "
             "(trainer.settings)"),
    _refused("_run_training", ACCELERATED, _LOOP + "override train_step or use hooks"),
    _refused("_run_train_epoch", ACCELERATED, _LOOP + "override train_step or use hooks"),
    _refused("_run_eval_epoch", ACCELERATED, "override eval_step(batch) or calculate_eval_batch_loss(batch)"),
    _refused("_clip_gradients", ACCELERATED, "give clip_grad_norm= or clip_grad_value="),
    # ------------------------------------------------------------ Hezar
    _called("compute_loss", HEZAR, "compute_loss(batch) -> loss (treadle's) or Hezar's compute_loss(outputs, "
            "labels) -> loss: every batch's loss, in training and evaluation"),
    _called("training_step", HEZAR, "training_step(batch) -> loss: every training batch's forward and backward "
            "(Hezar's); Lightning's training_step(batch, batch_idx) is refused: override compute_loss(self, batch)"),
    _called("evaluation_step", HEZAR, "evaluation_step(batch) -> outputs: every evaluation batch; the outputs' "
            "loss is the evaluation loss, the outputs what metrics= score"),
    _called("prepare_input_batch", HEZAR, "prepare_input_batch(batch) -> batch: every batch, on the device, "
            "before its loss, in training and evaluation"),
    _called("optimization_step", HEZAR, "optimization_step(): once per update: the optimizer step and zeroing "
            "the gradients"),
    _refused("inner_training_loop", HEZAR, _LOOP + "override training_step or use hooks"),
    # ------------------------------------------------------------ LiBai (DefaultTrainer, tools/train_net.py)
    *(_called(name, LIBAI, f"{name}: as LiBai's DefaultTrainer calls it", on="DefaultTrainer") for name in (
        "run_step", "build_hooks", "build_writers", "build_model", "build_optimizer", "build_lr_scheduler",
        "build_train_loader", "build_test_loader", "build_evaluator", "test")),
    _refused("run_step", LIBAI, "a step's run_step() takes no argument in treadle (LiBai's run_step(get_batch)): "
             "get each batch with self.next_batch()", on="step"),
    # ------------------------------------------------------------ Lightning's LightningModule names
    _refused("configure_optimizers", LIGHTNING, "give optimizer= and scheduler="),
    _refused("validation_step", LIGHTNING, "override eval_step(batch) or give metrics=[...]"),
    _refused("on_train_epoch_end", LIGHTNING, "give callbacks=[fn(trainer, epoch, metrics)] or a hook's after_epoch"),
)

#: pytorch-accelerated's callback events (``on_*``), for a hook or a callback
#: object given to the ``Trainer``: each is called as
#: ``on_<event>(trainer, **kwargs)`` at the stage of the same name above.
CALLBACK_EVENTS: Dict[str, str] = {
    "on_init_end": "when the Trainer is built",
    "on_training_run_start": "when train() starts",
    "on_train_epoch_start": "before each epoch's first update",
    "on_train_step_start": "before each training batch",
    "on_train_step_end": "after each training batch's loss, with batch= and batch_output= ({'loss', "
                         "'model_outputs', 'batch_size'})",
    "on_train_epoch_end": "after each epoch's last update, before its evaluation",
    "on_eval_epoch_start": "before each evaluation's first batch",
    "on_eval_step_start": "before each evaluation batch",
    "on_eval_step_end": "after each evaluation batch, with batch= and batch_output=",
    "on_eval_epoch_end": "after each evaluation's last batch",
    "on_training_run_epoch_end": "at each epoch's end, after its evaluation",
    "on_training_run_end": "when training ends",
    "on_evaluation_run_start": "when evaluate() is called outside training",
    "on_evaluation_run_end": "when such an evaluate() ends",
}

#: Each refused seed method, and the refusal's words (what to write instead).
SEED_METHODS: Dict[str, str] = {p.name: f"{p.seed}'s; {p.treadle}" for p in OVERRIDE_POINTS
                                if not p.called and p.on == "Trainer"}


def overridden(obj: Any, name: str, base: type) -> bool:
    """Whether ``obj``'s class defines ``name`` below ``base`` (a subclass's override)."""
    owner = next((c for c in type(obj).__mro__ if name in vars(c)), None)
    return owner is not None and owner is not base and issubclass(owner, base)


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


def refuse_seed_methods(trainer: Any, base: type) -> None:
    """Refuses, in one line, a ``Trainer`` subclass that defines a refused
    seed method (or Lightning's ``training_step(batch, batch_idx)``)."""
    cls = type(trainer).__name__
    for point in OVERRIDE_POINTS:
        if point.on == "Trainer" and not point.called and overridden(trainer, point.name, base):
            raise TypeError(f"{cls}.{point.name} ({point.seed}'s) is never called by treadle: {point.treadle} "
                            "(docs/migrating.md)")
    if overridden(trainer, "training_step", base) and required_positional(trainer.training_step) > 1:
        raise TypeError(f"{cls}.training_step takes (batch, batch_idx), Lightning's signature, which treadle never "
                        "calls: override compute_loss(self, batch), or Hezar's training_step(self, batch)")


def event_methods(obj: Any, where: str) -> Dict[str, Callable[..., Any]]:
    """The callback events (:data:`CALLBACK_EVENTS`) ``obj`` defines, by event
    name without its ``on_`` prefix; an ``on_*`` method that is not one is
    refused in one line (``where`` names the setting)."""
    found: Dict[str, Callable[..., Any]] = {}
    for name in dir(type(obj)):
        if not name.startswith("on_") or not callable(getattr(obj, name, None)):
            continue
        if name not in CALLBACK_EVENTS:
            raise TypeError(f"{where}: {type(obj).__name__}.{name} is not an event treadle calls (the events, "
                            f"pytorch-accelerated's: {', '.join(CALLBACK_EVENTS)}); see docs/migrating.md")
        found[name[3:]] = getattr(obj, name)
    return found


def refusal(name: str, on: str) -> str:
    """The refusal's words of a refused point of the table."""
    return next(p.treadle for p in OVERRIDE_POINTS if p.name == name and p.on == on and not p.called)


def override_rows(seed: Optional[str] = None) -> List[List[str]]:
    """The table as rows ``[name, where, treadle's answer]`` (of one seed's names, where given)."""
    rows = []
    for p in OVERRIDE_POINTS:
        if seed is None or seed in p.seed:
            rows.append([f"`{p.name}`", p.on, ("called: " if p.called else "refused: ") + p.treadle])
    return rows


def seeds() -> List[str]:
    """The seeds of the table, in its order."""
    return list(dict.fromkeys(p.seed for p in OVERRIDE_POINTS))


BEGIN, END = "<!-- override-points: generated by python tools/override_table.py -->", "<!-- override-points: end -->"


def render_markdown() -> str:
    """The table and the callback events as Markdown, the block of ``docs/migrating.md`` between its markers."""
    lines = [BEGIN, "", "| name | on | treadle | seed |", "|---|---|---|---|"]
    for row, point in zip(override_rows(), OVERRIDE_POINTS):
        lines.append("| " + " | ".join([*row, point.seed]) + " |")
    lines += ["", "| callback event | called |", "|---|---|"]
    lines += [f"| `{name}(trainer, **kwargs)` | {when} |" for name, when in CALLBACK_EVENTS.items()]
    return "\n".join([*lines, "", END])


def write_markdown(path: str) -> bool:
    """Replaces the block between the markers of ``path`` with :func:`render_markdown`; whether it changed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + render_markdown() + text[end:]
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text

