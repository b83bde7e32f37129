"""The seeds' override points: one table of every method the trainers
treadle's users come from document as overridable, with treadle's answer.

A user of qurious, pytorch-accelerated, Hezar or LiBai subclasses the
trainer and overrides the method their trainer calls (``train_step``,
``calculate_train_batch_loss``, ``prepare_input_batch``...), or writes a
callback with pytorch-accelerated's event names (``on_train_epoch_end``).
Each name here is either

- **called**: the plain :class:`~treadle.trainer.Trainer` (or
  ``DefaultTrainer``, or a hook's callback) calls it at the seed's moment
  with the seed's arguments and return contract; treadle's own update,
  resume, hooks and processes stay around it; or
- **refused**: a subclass (or a hook, a callback, a step) that defines it is
  refused when it is built, in one line naming what to write in treadle.

Nothing a seed documents is defined and left unused. ``docs/migrating.md``
shows this table (:func:`override_rows`), and a test walks it.

Each row says until when it holds (``removed_in``). A called name that is
only another trainer's is the way in for that trainer's users, not
treadle's own way: it is called through the 0.x versions and goes in
:data:`CALLED_UNTIL`, from which it is refused in one line naming treadle's
way, as the refused names are now. A called name that is treadle's own too
(:data:`TREADLES_OWN`: ``DefaultTrainer.build_model``, the plain
``Trainer``'s ``train_step``...) stays, and so does a refused name: its
refusal is what keeps it from being defined and silently unused.

:data:`SEED_SETTINGS` maps the seeds' setting names (Hezar's ``num_epochs``,
the Hugging Face ``per_device_train_batch_size``, detectron2's
``train.amp.enabled``...) to treadle's: a ``Trainer`` argument or a
``train.*`` config key. The "Coming from ..." pages of ``docs/coming_from/``
show both tables, each row joined with the setting's own description, as
``tools/seed_pages.py`` generates them.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any, Callable, Dict, List, Optional, Tuple

from treadle.utils.signatures import required_positional

__all__ = [
    "OverridePoint",
    "OVERRIDE_POINTS",
    "CALLED_UNTIL",
    "TREADLES_OWN",
    "SEED_METHODS",
    "CALLBACK_EVENTS",
    "overridden",
    "refuse_seed_methods",
    "refuse_methods_set_on_instance",
    "compute_loss_seed",
    "event_methods",
    "override_rows",
    "required_positional",
    "refuse_libai_run_step",
    "check_call",
    "schedule_step_in",
    "refusal",
    "SeedSetting",
    "SEED_SETTINGS",
    "seed_setting_hint",
]

QURIOUS, ACCELERATED, HEZAR, LIBAI, LIGHTNING = "qurious", "pytorch-accelerated", "Hezar", "LiBai", "Lightning"
DETECTRON2, HUGGING_FACE = "detectron2", "Hugging Face"


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
    #: The arguments it is called with, where the table says (``("batch",)``);
    #: a definition that cannot take them is refused when built.
    args: Optional[Tuple[str, ...]] = None
    #: The version from which a called name is refused instead; None where
    #: the name stays (treadle's own name too, or a refused name).
    removed_in: Optional[str] = None

    def until(self) -> str:
        """The row's end, as the tables show it."""
        if self.removed_in is not None:
            return f"called until {self.removed_in}, then refused"
        return "kept (treadle's own name too)" if self.called else "refused for good"


def possessive(seed: str) -> str:
    """``"qurious'"``, ``"Hezar's"``: a seed's name as the owner of a method."""
    return seed + ("'" if seed.endswith("s") else "'s")


#: The version in which the called names of the table that are only another
#: trainer's go (they are refused from it).
CALLED_UNTIL = "1.0"

#: The called names that are also treadle's own methods, by where they are
#: defined: they stay (a test checks this against the classes).
TREADLES_OWN = frozenset({
    ("Trainer", "train_step"), ("Trainer", "eval_step"), ("Trainer", "evaluate"), ("Trainer", "compute_loss"),
    *(("DefaultTrainer", name) for name in (
        "run_step", "build_hooks", "build_writers", "build_model", "build_optimizer", "build_lr_scheduler",
        "build_train_loader", "build_test_loader", "build_evaluator", "test")),
})


def _called(name: str, seed: str, when: str, on: str = "Trainer") -> OverridePoint:
    # The call the description starts with ("train_step(batch) -> ...") is the call checked.
    args = None
    if when.startswith(name + "(") and name != "compute_loss":  # compute_loss: treadle's (batch) or Hezar's pair
        inside = when[len(name) + 1:when.index(")")]
        args = tuple(a.strip() for a in inside.split(",") if a.strip())
    return OverridePoint(name, seed, on, True, when, args,
                         removed_in=None if (on, name) in TREADLES_OWN else CALLED_UNTIL)


def _refused(name: str, seed: str, instead: str, on: str = "Trainer") -> OverridePoint:
    return OverridePoint(name, seed, on, False, instead)


_LOOP = "treadle's loop trains by iterations (TrainerBase): "
_DATA = "give the Trainer a DataLoader (train_loader=, eval_loader=), which it iterates as given"

#: The table: every override point the seeds document, called or refused.
OVERRIDE_POINTS: Tuple[OverridePoint, ...] = (
    # ------------------------------------------------------------ qurious
    _called("train_step", QURIOUS, "train_step(batch) -> {'loss': float, ...}: the whole update of one batch (on "
            "the device), once per iteration of train() and train_epoch(); the floats returned are published "
            "('loss' as total_loss). The schedule stays treadle's, stepped after it (a train_step that steps it too, "
            "self.scheduler.step() or self.scheduler_step(), is refused when built); settings that act inside treadle's update (grad_accum_steps, "
            "clip_grad_*, precision, compile) are refused with it"),
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
            "labels) -> loss, told apart by their parameters: every batch's loss, in training and evaluation; Hezar's "
            "gets a dict batch's labels, and the model the other keys (model(**inputs)), as Hezar calls them"),
    _called("training_step", HEZAR, "training_step(batch) -> loss: every training batch's forward and backward "
            "(Hezar's); under grad_accum_steps each backward in it, its own (loss.backward(), "
            "self.backward_step(loss)) and super().training_step(batch)'s alike, is of the whole loss, and the "
            "update's gradients are the micro-batches' mean, as Hezar's accelerator.backward makes them; Lightning's "
            "training_step(batch, batch_idx) is refused: override compute_loss(self, batch)"),
    _called("evaluation_step", HEZAR, "evaluation_step(batch) -> outputs: every evaluation batch; the outputs' "
            "loss is the evaluation loss, the outputs what metrics= score"),
    _called("prepare_input_batch", HEZAR, "prepare_input_batch(batch) -> batch: every batch, on the device, "
            "before its loss, in training and evaluation"),
    _called("optimization_step", HEZAR, "optimization_step(): once per update: the optimizer step and zeroing "
            "the gradients"),
    _refused("inner_training_loop", HEZAR, _LOOP + "override training_step or use hooks"),
    # ------------------------------------------------------------ the Hugging Face Trainer
    _called("compute_loss", HUGGING_FACE, "compute_loss(model, inputs, return_outputs=False) -> loss, told from "
            "treadle's and Hezar's by its parameter model: every training batch's loss (inputs: the batch, a "
            "dict copied, so that popping its labels leaves the batch whole; num_items_in_batch is not given, "
            "the loss is divided by grad_accum_steps); with return_outputs=True -> (loss, outputs) for every "
            "evaluation batch: the evaluation loss, and the outputs metrics= score"),
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
    "on_train_step_start": "before each training batch (before a train_step or training_step override)",
    "on_train_step_end": "after each training batch's loss, with batch= and batch_output= ({'loss', "
                         "'model_outputs', 'batch_size'}); after a train_step override, or a training_step that "
                         "runs its own backward without super(): with the loss it returns, model_outputs None",
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
SEED_METHODS: Dict[str, str] = {p.name: f"{possessive(p.seed)}; {p.treadle}" for p in OVERRIDE_POINTS
                                if not p.called and p.on == "Trainer"}


def overridden(obj: Any, name: str, base: type) -> bool:
    """Whether ``obj``'s class defines ``name`` below ``base`` (a subclass's override)."""
    owner = next((c for c in type(obj).__mro__ if name in vars(c)), None)
    return owner is not None and owner is not base and issubclass(owner, base)


def refuse_seed_methods(trainer: Any, base: type) -> None:
    """Refuses, in one line, a ``Trainer`` subclass that defines a refused
    seed method (or Lightning's ``training_step(batch, batch_idx)``)."""
    cls = type(trainer).__name__
    for point in OVERRIDE_POINTS:
        if point.on == "Trainer" and not point.called and overridden(trainer, point.name, base):
            raise TypeError(f"{cls}.{point.name} ({possessive(point.seed)}) is never called by treadle: {point.treadle} "
                            "(docs/migrating.md)")
    if overridden(trainer, "training_step", base) and required_positional(trainer.training_step) > 1:
        raise TypeError(f"{cls}.training_step takes (batch, batch_idx), Lightning's signature, which treadle never "
                        "calls: override compute_loss(self, batch), or Hezar's training_step(self, batch)")
    for point in OVERRIDE_POINTS:
        if point.on == "Trainer" and point.args is not None and overridden(trainer, point.name, base):
            check_call(f"{cls}.{point.name}", getattr(trainer, point.name), point.args, {},
                       f"{possessive(point.seed)} contract")


def compute_loss_seed(trainer: Any, base: type) -> Optional[str]:
    """Whose ``compute_loss`` a ``Trainer`` subclass defines, told by its
    parameters when the ``Trainer`` is built: ``"treadle"`` (``compute_loss(batch)``),
    Hezar's (``compute_loss(outputs, labels)``) or the Hugging Face Trainer's
    (``compute_loss(model, inputs, return_outputs=False)``, whose first
    parameter is ``model``); None where it is not overridden. A Hugging Face
    one that cannot take ``return_outputs=True`` is refused in one line."""
    if not overridden(trainer, "compute_loss", base):
        return None
    method = trainer.compute_loss
    try:
        names = list(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        names = []
    if names[:1] == ["model"]:
        check_call(f"{type(trainer).__name__}.compute_loss", method, ("model", "inputs"), {"return_outputs": True},
                   "the Hugging Face Trainer's contract")
        return HUGGING_FACE
    return HEZAR if required_positional(method) >= 2 else "treadle"


def refuse_methods_set_on_instance(trainer: Any) -> None:
    """Refuses, in one line when training starts, a seed's method set on the
    ``Trainer`` object (``trainer.optimizer_step = fn``): which methods are
    called is read from the class when the ``Trainer`` is built, so one set
    on the object after would never be called."""
    names = {p.name for p in OVERRIDE_POINTS if p.on == "Trainer"}
    for name in vars(trainer):
        if name in names:
            raise TypeError(f"trainer.{name} was set on the Trainer object, where treadle never calls it (the "
                            f"methods it calls are read from the Trainer's class when it is built): define "
                            f"{name} in a subclass, class MyTrainer(Trainer): def {name}(self, ...), and build "
                            "MyTrainer (docs/migrating.md)")


def check_call(what: str, method: Callable[..., Any], args: Tuple[str, ...], kwargs: Dict[str, Any],
               contract: str) -> None:
    """Refuses, in one line, a method (or function) that cannot be called as
    treadle calls it, ``method(*args, **kwargs)``: ``what`` names it
    (``"Cls.method"``, ``"callbacks: fn"``), ``contract`` says whose call it is."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        call = ", ".join([*args, *(f"{k}=..." for k in kwargs)])
        called = what.rpartition(" ")[2].rpartition(".")[2]
        raise TypeError(f"{what}{signature} cannot be called as treadle calls it, {called}({call}) "
                        f"({contract}); see docs/migrating.md") from None


def schedule_step_in(method: Callable[..., Any]) -> Optional[str]:
    """The first call in ``method``'s source that steps the trainer's
    learning-rate schedule (``self.scheduler.step()``, pytorch-accelerated's
    ``self.scheduler_step()``), as written; None where there is none, or no
    source to read (the schedule's hook then finds the extra step at the
    first iteration). Read once, when the ``Trainer`` is built."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(method))))
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        target = node.func.value
        if (node.func.attr == "step" and isinstance(target, ast.Attribute) and target.attr == "scheduler") or (
                node.func.attr == "scheduler_step" and isinstance(target, ast.Name) and target.id == "self"):
            return ast.unparse(node)
    return None


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
        method = getattr(obj, name)
        step_end = name in ("on_train_step_end", "on_eval_step_end")
        check_call(f"{where}: {type(obj).__name__}.{name}", method, ("trainer",),
                   {"batch": None, "batch_output": None} if step_end else {}, "pytorch-accelerated's callback event")
        found[name[3:]] = method
    return found


def refuse_libai_run_step(step: Any) -> None:
    """Refuses, in one line, a step whose ``run_step`` takes LiBai's
    ``get_batch``: the loop calls ``step.run_step()`` with no argument."""
    if required_positional(step.run_step) > 0:
        raise TypeError(f"{type(step).__name__}.run_step takes arguments, and the trainer calls step.run_step() "
                        "with none: " + refusal("run_step", "step"))


def refusal(name: str, on: str) -> str:
    """The refusal's words of a refused point of the table."""
    return next(p.treadle for p in OVERRIDE_POINTS if p.name == name and p.on == on and not p.called)


def override_rows(seed: Optional[str] = None) -> List[List[str]]:
    """The table as rows ``[name, where, treadle's answer, until]`` (of one seed's names, where given)."""
    rows = []
    for p in OVERRIDE_POINTS:
        if seed is None or seed in p.seed:
            rows.append([f"`{p.name}`", p.on, ("called: " if p.called else "refused: ") + p.treadle, p.until()])
    return rows


def seeds() -> List[str]:
    """The seeds of the table, in its order."""
    return list(dict.fromkeys(p.seed for p in OVERRIDE_POINTS))


@dataclasses.dataclass(frozen=True)
class SeedSetting:
    """One setting a seed's users write, and treadle's name for it.

    Attributes:
        seed: whose name it is (``"Hezar"``, ``"Hugging Face"``...).
        name: the seed's name, as its users write it (an argument, a field
            of its config object, a config key).
        treadle: treadle's: an argument of the plain ``Trainer`` (a row of
            :data:`~treadle.trainer.settings.SETTINGS`, or one of
            ``TRAINER_ARGUMENTS`` of ``tools/seed_pages.py``) or a config key ``train.<key>`` of
            :mod:`treadle.config.train_keys`.
        note: what differs from the seed, where something does.
    """

    seed: str
    name: str
    treadle: str
    note: str = ""


_S = SeedSetting

#: The seeds' setting names and treadle's, seed by seed. A test checks that
#: every ``treadle`` name is a setting or a ``train.*`` key, so a rename
#: fails CI; the pages show each row with that setting's description.
SEED_SETTINGS: Tuple[SeedSetting, ...] = (
    # ------------------------------------------------------------ Hezar's TrainerConfig and Trainer(...)
    _S(HEZAR, "model", "model"),
    _S(HEZAR, "train_dataset", "train_loader"),
    _S(HEZAR, "eval_dataset", "eval_loader"),
    _S(HEZAR, "do_evaluate", "eval_loader", "evaluation runs when an eval_loader is given"),
    _S(HEZAR, "data_collator", "collate_fn"),
    _S(HEZAR, "output_dir", "output_dir"),
    _S(HEZAR, "device", "device"),
    _S(HEZAR, "use_cpu=True", "device", "device='cpu'"),
    _S(HEZAR, "seed", "seed", "seed=None does not seed (Hezar's default is 42)"),
    _S(HEZAR, "num_epochs", "max_epochs"),
    _S(HEZAR, "max_steps", "max_iter"),
    _S(HEZAR, "init_weights_from", "init_weights_from", "a local checkpoint or state dict; nothing is downloaded"),
    _S(HEZAR, "optimizer", "optimizer", "'adamw', 'adam' or 'sgd' (torch's class with torch's defaults: 'sgd' "
       "has no momentum, as Hezar's; ('sgd', {'momentum': 0.9}) adds options), or an optimizer object"),
    _S(HEZAR, "learning_rate", "lr"),
    _S(HEZAR, "weight_decay", "weight_decay", "norms and biases get none unless no_decay_norm_and_bias=False"),
    _S(HEZAR, "lr_scheduler", "scheduler", "what a name builds is logged in torch's terms ('cosine': "
       "CosineAnnealingLR over the run)"),
    _S(HEZAR, "lr_scheduler_kwargs", "scheduler", "scheduler=('step', {'steps': [600], 'gamma': 0.5})"),
    _S(HEZAR, "batch_size", "batch_size"),
    _S(HEZAR, "eval_batch_size", "eval_batch_size"),
    _S(HEZAR, "num_dataloader_workers", "num_workers"),
    _S(HEZAR, "dataloader_shuffle", "shuffle"),
    _S(HEZAR, "gradient_accumulation_steps", "grad_accum_steps"),
    _S(HEZAR, "mixed_precision", "precision", "Hezar's 'full' is 'fp32'; fp16 needs CUDA"),
    _S(HEZAR, "distributed=True", "ddp", "run the same script under torchrun --nproc-per-node N"),
    _S(HEZAR, "metrics", "metrics", "('cer', {'decode': ..., 'decode_targets': ...}): the decoder is Hezar's "
       "preprocessor's job there; 'seqeval' reads the model's config.id2label"),
    _S(HEZAR, "metric_for_best_model", "best_metric", "'evaluation.cer' and 'eval/cer' are accepted for 'cer'"),
    _S(HEZAR, "save_steps", "checkpoint_period", "every checkpoint_period iterations only, where Hezar saves at "
       "each epoch's end too: leave it out to save each epoch (Hezar's save_steps=None or 0; 0 here saves none), or "
       "give a divisor of an epoch's iterations (its batches // grad_accum_steps) to have both"),
    _S(HEZAR, "log_steps", "log_period"),
    _S(HEZAR, "checkpoints_dir", "checkpoints_dir"),
    _S(HEZAR, "logs_dir", "logs_dir"),
    _S(HEZAR, "evaluate_with_generate", "evaluate_with_generate"),
    # ------------------------------------------------------------ pytorch-accelerated: Trainer(...) and train(...)
    _S(ACCELERATED, "model", "model"),
    _S(ACCELERATED, "loss_func", "loss_fn"),
    _S(ACCELERATED, "optimizer", "optimizer"),
    _S(ACCELERATED, "callbacks", "callbacks", "objects with on_* methods, each called at its event"),
    _S(ACCELERATED, "train_dataset", "train_loader", "given to the Trainer, not to train()"),
    _S(ACCELERATED, "eval_dataset", "eval_loader"),
    _S(ACCELERATED, "num_epochs", "max_epochs"),
    _S(ACCELERATED, "per_device_batch_size", "batch_size", "total_batch_size= is the batch over all processes"),
    _S(ACCELERATED, "gradient_accumulation_steps", "grad_accum_steps"),
    _S(ACCELERATED, "create_scheduler_fn", "scheduler", "a factory of the optimizer (and max_iter, for "
       "TrainerPlaceholderValues); per iteration, as pytorch-accelerated steps per batch"),
    _S(ACCELERATED, "collate_fn", "collate_fn"),
    # ------------------------------------------------------------ qurious: Trainer(...) and train(...)
    _S(QURIOUS, "model", "model"),
    _S(QURIOUS, "optimizer", "optimizer"),
    _S(QURIOUS, "loss_fn", "loss_fn"),
    _S(QURIOUS, "device", "device"),
    _S(QURIOUS, "scheduler", "scheduler"),
    _S(QURIOUS, "train_dataloader", "train_loader", "given to the Trainer, not to train()"),
    _S(QURIOUS, "num_epochs", "max_epochs"),
    _S(QURIOUS, "eval_dataloader", "eval_loader"),
    _S(QURIOUS, "save_dir", "output_dir"),
    _S(QURIOUS, "save_freq", "checkpoint_period", "counted in iterations; by default one epoch"),
    _S(QURIOUS, "best_model_metric", "best_metric", "model_best.pth in output_dir, written only when best_metric "
       "is given: qurious saves the best model by 'eval_loss' without it; best_metric='eval_loss' does so"),
    _S(QURIOUS, "early_stopping_patience", "early_stopping_patience"),
    _S(QURIOUS, "callbacks", "callbacks", "fn(trainer, epoch, metrics), as qurious calls them"),
    _S(QURIOUS, "config.training.max_grad_norm", "clip_grad_norm"),
    _S(QURIOUS, "config.training.scheduler_step_per_batch", "scheduler_interval", "True is 'iter', False 'epoch'"),
    # ------------------------------------------------------------ the Hugging Face TrainingArguments and Trainer(...)
    _S(HUGGING_FACE, "model", "model"),
    _S(HUGGING_FACE, "train_dataset", "train_loader"),
    _S(HUGGING_FACE, "eval_dataset", "eval_loader"),
    _S(HUGGING_FACE, "data_collator", "collate_fn"),
    _S(HUGGING_FACE, "compute_metrics", "metrics", "names, torchmetrics objects or evaluators"),
    _S(HUGGING_FACE, "callbacks", "hooks", "a hook's stages: before_train, after_step, after_epoch..."),
    _S(HUGGING_FACE, "output_dir", "output_dir"),
    _S(HUGGING_FACE, "seed", "seed"),
    _S(HUGGING_FACE, "num_train_epochs", "max_epochs"),
    _S(HUGGING_FACE, "max_steps", "max_iter", "with max_epochs, training stops at whichever comes first (a "
       "warning says when max_epochs does), where Hugging Face's max_steps overrides num_train_epochs: leave "
       "max_epochs out"),
    _S(HUGGING_FACE, "per_device_train_batch_size", "batch_size", "total_batch_size= is the batch over all "
       "processes"),
    _S(HUGGING_FACE, "per_device_eval_batch_size", "eval_batch_size"),
    _S(HUGGING_FACE, "dataloader_num_workers", "num_workers"),
    _S(HUGGING_FACE, "learning_rate", "lr"),
    _S(HUGGING_FACE, "weight_decay", "weight_decay"),
    _S(HUGGING_FACE, "warmup_steps", "warmup_iters"),
    _S(HUGGING_FACE, "lr_scheduler_type", "scheduler", "'cosine', 'linear', or none for constant: the same "
       "per-step rates as transformers' schedules with warm-up"),
    _S(HUGGING_FACE, "gradient_accumulation_steps", "grad_accum_steps"),
    _S(HUGGING_FACE, "max_grad_norm", "clip_grad_norm", "off by default (the Hugging Face Trainer clips at 1.0)"),
    _S(HUGGING_FACE, "bf16=True, fp16=True", "precision", "precision='bf16' or 'fp16'"),
    _S(HUGGING_FACE, "torch_compile", "compile"),
    _S(HUGGING_FACE, "fsdp='full_shard'", "ddp", "ddp='fsdp' (FSDP2; options as train.ddp's: ddp={'kind': "
       "'fsdp', 'reshard_after_forward': True})"),
    _S(HUGGING_FACE, "eval_steps", "eval_period"),
    _S(HUGGING_FACE, "save_steps", "checkpoint_period"),
    _S(HUGGING_FACE, "logging_steps", "log_period"),
    _S(HUGGING_FACE, "save_total_limit", "max_to_keep"),
    _S(HUGGING_FACE, "metric_for_best_model", "best_metric", "'eval_loss' is accepted"),
    _S(HUGGING_FACE, "greater_is_better", "best_mode", "'max' or 'min'"),
    _S(HUGGING_FACE, "EarlyStoppingCallback(early_stopping_patience=N)", "early_stopping_patience"),
    _S(HUGGING_FACE, "predict_with_generate, generation_max_length", "evaluate_with_generate",
       "evaluate_with_generate=True, or {'max_length': ...}"),
    # ------------------------------------------------------------ Lightning's Trainer(...)
    _S(LIGHTNING, "max_epochs", "max_epochs"),
    _S(LIGHTNING, "max_steps", "max_iter"),
    _S(LIGHTNING, "accumulate_grad_batches", "grad_accum_steps"),
    _S(LIGHTNING, "gradient_clip_val", "clip_grad_norm", "gradient_clip_algorithm='value' is clip_grad_value"),
    _S(LIGHTNING, "precision", "precision", "'bf16-mixed' is 'bf16', '16-mixed' is 'fp16'"),
    _S(LIGHTNING, "accelerator, devices", "device", "one device per process; processes come from torchrun"),
    _S(LIGHTNING, "strategy", "ddp", "'ddp' (the default) or 'fsdp'"),
    _S(LIGHTNING, "default_root_dir", "output_dir"),
    _S(LIGHTNING, "log_every_n_steps", "log_period"),
    _S(LIGHTNING, "val_check_interval", "eval_period", "in updates, where an integer counts Lightning's batches"),
    _S(LIGHTNING, "callbacks", "hooks", "a hook's before_train, after_step, after_epoch..."),
    _S(LIGHTNING, "ModelCheckpoint(monitor, mode)", "best_metric", "and best_mode"),
    _S(LIGHTNING, "EarlyStopping(monitor, patience)", "early_stopping_patience", "on best_metric"),
    _S(LIGHTNING, "configure_optimizers' {'interval': 'epoch'}", "scheduler_interval"),
    _S(LIGHTNING, "seed_everything(seed)", "seed"),
    # ------------------------------------------------------------ detectron2's LazyConfig train node
    *(_S(DETECTRON2, f"train.{key}", f"train.{key}") for key in (
        "output_dir", "init_checkpoint", "max_iter", "eval_period", "log_period", "device", "checkpointer.period",
        "checkpointer.max_to_keep", "ddp.broadcast_buffers", "ddp.find_unused_parameters",
        "ddp.fp16_compression")),
    _S(DETECTRON2, "train.amp.enabled", "train.step.precision", "'fp16' for amp.enabled=True (or 'bf16'); "
       "train.amp is not read, and warned about"),
    # ------------------------------------------------------------ LiBai's config.py
    *(_S(LIBAI, f"train.{key}", f"train.{key}") for key in (
        "output_dir", "log_period", "checkpointer.period", "checkpointer.max_to_keep", "seed")),
    _S(LIBAI, "train.train_iter", "train.max_iter"),
    _S(LIBAI, "train.evaluation.eval_period", "train.eval_period"),
    _S(LIBAI, "train.load_weight", "train.init_checkpoint"),
    _S(LIBAI, "train.amp.enabled", "train.step.precision", "'fp16' for amp.enabled=True (or 'bf16')"),
    _S(LIBAI, "train.num_accumulation_steps", "train.step.grad_accum_steps"),
    _S(LIBAI, "graph.enabled", "train.step.kind", "graph.enabled=True is read as train.step.kind='compiled' "
       "(CompiledStep, through torch.compile)"),
)


def _owner(seed: str) -> str:
    """Whose setting a seed's name is, as a message says it."""
    return {HUGGING_FACE: "the Hugging Face Trainer's", LIGHTNING: "Lightning's"}.get(seed, possessive(seed))


def seed_setting_hint(name: str) -> Optional[str]:
    """What a ``Trainer`` keyword argument that is another trainer's setting
    name (:data:`SEED_SETTINGS`: the Hugging Face ``num_train_epochs``,
    Lightning's ``accumulate_grad_batches``...) is called here:
    ``"the Hugging Face Trainer's num_train_epochs is max_epochs here"``,
    with the table's notes; None for a name no seed has."""
    rows = [s for s in SEED_SETTINGS
            if name in (part.split("=")[0] for part in s.name.split(", ")) and s.treadle != name]
    if not rows:
        return None
    owners = list(dict.fromkeys(_owner(s.seed) for s in rows))
    who = owners[0] if len(owners) == 1 else ", ".join(owners[:-1]) + " and " + owners[-1]
    targets = " or ".join(dict.fromkeys(s.treadle for s in rows))
    notes = "; ".join(dict.fromkeys(s.note for s in rows if s.note))
    return f"{who} {name} is {targets} here" + (f" ({notes})" if notes else "")
