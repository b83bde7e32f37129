"""The table of the plain ``Trainer``'s settings: each one's name, type,
default, rule, meaning and what it needs in order to act, said once.

The settings are grouped by purpose, each group a frozen dataclass whose
fields are its settings (:class:`DataSettings`, :class:`OptimizationSettings`,
:class:`EvaluationSettings`, :class:`CheckpointSettings`,
:class:`LoggingSettings`, :class:`ProcessSettings`): a field's type is what
the ``Trainer`` reads (``trainer.settings.evaluation.eval_period``, checked by
mypy), its default the setting's, its metadata the rest of the setting's row.
:data:`SETTINGS`, the table, is those rows; the ``Trainer``'s signature and
the settings sections of its docstring are made from it
(:func:`~treadle.trainer.settings_docs.document_settings`).
:class:`TrainerSettingsDict` types the same settings as the ``Trainer``
takes them (``**settings``), for mypy and editors; a test checks it
against the groups' fields.

It is to :class:`~treadle.trainer.Trainer` what :mod:`treadle.config.train_keys`
is to ``train.*``, and shares that table's rows where a setting means the
same thing (precision, clipping, periods, checkpoint keeping, the EMA decay,
the process group's timeout): the rule and the words come from there.

:func:`check_settings` reads it before the ``Trainer`` builds or writes
anything. A setting given with a value its rule refuses is an error naming
it; a setting given where it cannot act (``eval_period`` without an
evaluation set, ``shuffle`` with a ``DataLoader``, ``warmup_iters`` with a
scheduler object...) is refused in one line, or, where the users of the
trainers you may come from commonly pass it harmlessly (``checkpoint_period`` without ``output_dir``,
``ddp`` on one process), warned about in one line. No setting is ignored
without a word. What a setting needs is decided on a :class:`Situation`:
what the objects given are, before any is built.

:mod:`treadle.trainer.settings_docs` shows the table to readers: the
``Trainer``'s docstring and signature, and ``docs/trainer.md``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Optional, Sequence, Tuple, TypedDict, TypeVar, Union

from treadle.config.errors import ConfigError
from treadle.config.rules import (
    Rule,
    boolean,
    choice,
    integer,
    is_int,
    non_negative_number,
    path,
    positive_number,
    text,
)
from treadle.config.train_keys import KEYS as TRAIN_KEYS
from treadle.compat.names import seed_setting_hint
from treadle.hooks import HookBase
from treadle.utils.deprecations import warn_deprecated

from . import setting_rules as rules
from .setting_rules import FILE_LOGGERS, LOGGERS

if TYPE_CHECKING:
    import torch

    from treadle.engine.history import EpochCallback

__all__ = [
    "given_settings",
    "situation_of",
    "Need",
    "Setting",
    "Situation",
    "SETTINGS",
    "GROUPS",
    "TrainerSettings",
    "TrainerSettingsDict",
    "DataSettings",
    "OptimizationSettings",
    "EvaluationSettings",
    "CheckpointSettings",
    "LoggingSettings",
    "ProcessSettings",
    "LOGGERS",
    "FILE_LOGGERS",
    "check_settings",
    "checked_settings",
    "replaced_settings",
    "wrapper_of",
    "setting",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T", bound=type)



@dataclasses.dataclass(frozen=True)
class Situation:
    """What the settings' needs are decided on, before anything is built.

    Attributes:
        train: ``"dataset"`` (samples the ``Trainer`` batches: a torch
            ``Dataset``, a list), ``"batches"`` (an iterable of batches with
            a length that is not a list: a ``DataLoader``) or ``"stream"``
            (batches without a length: a generator).
        eval: ``"none"``, ``"dataset"`` or ``"batches"``.
        train_type, eval_type: the objects' type names, for messages.
        optimizer: ``"name"`` or ``"object"``.
        scheduler: ``"none"``, ``"name"``, ``"fvcore"`` (a ``ParamScheduler``),
            ``"torch"`` (a torch scheduler object) or ``"factory"``.
        scheduler_fits: ``False`` for a torch scheduler object built on
            another optimizer than the one trained (or given with a named one).
        processes: how many processes train (torchrun's or ``launch``'s).
        cuda: whether the model will be on a CUDA device.
        generates: whether the model has a ``generate()`` method.
        values: every setting's value, given or default.
    """

    train: str
    eval: str
    train_type: str
    eval_type: str
    optimizer: str
    scheduler: str
    scheduler_fits: bool
    processes: int
    cuda: bool
    generates: bool
    values: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


@dataclasses.dataclass(frozen=True)
class Need:
    """What a setting needs in order to act.

    ``holds(situation, value)`` says whether it has it; when not, the setting
    is refused (``refuse``) or warned about, with ``message`` formatted with
    ``name``, ``value`` (as code shows it), ``train``/``eval`` (the types of
    the data given) and every setting's value by name. ``key`` names the
    need for the tests that walk the table.
    """

    key: str
    holds: Callable[[Situation, Any], bool]
    message: str
    refuse: bool = True


@dataclasses.dataclass(frozen=True)
class Setting:
    """One argument of ``Trainer``: its name, default, rule (``None``: any
    value), one line on what it does, and what it needs to act. ``train_key``
    names the ``train.*`` key it shares its meaning with; ``group``, the
    field of :class:`TrainerSettings` that holds it."""

    name: str
    default: Any
    rule: Optional[Rule]
    doc: str
    needs: Tuple[Need, ...] = ()
    train_key: Optional[str] = None
    group: str = ""


# ---------------------------------------------------------------------- needs
def _given(name: str) -> Callable[[Situation, Any], bool]:
    return lambda s, v: s[name] is not None


_OUTPUT_DIR = _given("output_dir")
_TRAIN_DATASET = lambda s, v: s.train == "dataset"  # noqa: E731
_ANY_DATASET = lambda s, v: "dataset" in (s.train, s.eval)  # noqa: E731
_EPOCHS = lambda s, v: s.train != "stream"  # noqa: E731
_NAMED_OPTIMIZER = lambda s, v: s.optimizer == "name"  # noqa: E731
_SEVERAL_PROCESSES = lambda s, v: s.processes > 1  # noqa: E731


def _watches_an_evaluation(s: Situation, v: Any) -> bool:
    from .evaluation import watches_training

    return s.eval != "none" or watches_training(s["best_metric"])


def _watched_training_scalar_is_read(s: Situation, v: Any) -> bool:
    """Without an evaluation, a training ``best_metric`` is read every
    ``eval_period`` iterations, by default each epoch: it needs one of them."""
    from .evaluation import watches_training

    return s.eval != "none" or not watches_training(s["best_metric"]) or s["eval_period"] is not None or _EPOCHS(s, v)


_MAKES_ITS_OWN = "this train_loader ({train}) makes its own batches"
_NOT_WRITTEN = "without output_dir nothing is written: give output_dir"


#: Where a settings group's field keeps its row of the table.
_ROW = "treadle.setting"


def _row(default: Any, rule: Optional[Rule], doc: str, *needs: Need) -> Any:
    """A field of a settings group: its default, and its row of the table
    (named by the field; :data:`SETTINGS` gathers them)."""
    return dataclasses.field(default=default, metadata={_ROW: Setting("", default, rule, doc, tuple(needs))})


_TRAIN = {key.name: key for key in TRAIN_KEYS}


def _shared(train_key: str, *needs: Need, default: Any = dataclasses.MISSING, doc: str = "",
            rule: Optional[Rule] = None) -> Any:
    """A field that means what ``train.<train_key>`` means: its rule and words
    (``doc`` adds to them), and its default, unless the ``Trainer``'s differ."""
    key = _TRAIN[train_key]
    default = key.default if default is dataclasses.MISSING else default
    row = Setting("", default, rule or key.rule, f"{key.doc} {doc}".strip(), tuple(needs), train_key)
    return dataclasses.field(default=default, metadata={_ROW: row})


# ---------------------------------------------------------------------- the table, by purpose
# Each group is a frozen dataclass whose fields are the settings: the field's
# type is what the Trainer reads (mypy checks it), its default the setting's,
# and its metadata the rest of the setting's row.
@dataclasses.dataclass(frozen=True)
class DataSettings:
    """How a dataset given as ``train_loader`` or ``eval_loader`` is batched (data that makes its own batches, a
    ``DataLoader``, needs none of these)."""

    batch_size: Optional[int] = _row(
        None, integer(1), "The batch of a dataset per process (and of an evaluation dataset "
        "without eval_batch_size).",
        Need("no total_batch_size", lambda s, v: s["total_batch_size"] is None,
             "batch_size={value} (per process) and total_batch_size={total_batch_size} (over all processes) "
             "were both given: give one"),
        Need("a dataset", _ANY_DATASET, "batch_size and total_batch_size are for a dataset; " + _MAKES_ITS_OWN))
    total_batch_size: Optional[int] = _row(None, integer(1), "Instead of batch_size, the samples of one step over all "
        "processes (the configs' convention); evaluation batches total_batch_size / processes.",
        Need("a dataset", _TRAIN_DATASET, "batch_size and total_batch_size are for a dataset; " + _MAKES_ITS_OWN))
    eval_batch_size: Optional[int] = _row(
        None, integer(1), "The batch of an evaluation dataset (default: the training batch "
        "per process).",
        Need("an evaluation dataset", lambda s, v: s.eval != "batches",
             "eval_batch_size is for a dataset; this eval_loader ({eval}) is taken as its own batches"),
        Need("an evaluation set", lambda s, v: s.eval != "none",
             "eval_batch_size={value} batches an evaluation dataset, and no eval_loader is given: it acts only on "
             "a dataset given to evaluate()", refuse=False))
    shuffle: bool = _row(True, boolean, "Whether a dataset's order is shuffled (seeded, resumable).",
        Need("a dataset", _TRAIN_DATASET, "shuffle is for a dataset the Trainer batches; " + _MAKES_ITS_OWN +
             " in its own order (DataLoader(..., shuffle=...))"))
    collate_fn: Optional[Callable[[list], Any]] = _row(
        None, rules.callable_or_none, "Turns a list of samples into a batch (Hezar's data_collator).",
        Need("a dataset", _ANY_DATASET, "collate_fn is for a dataset; " + _MAKES_ITS_OWN))
    num_workers: int = _row(0, integer(0), "Data-loading processes for a dataset the Trainer batches.",
        Need("a dataset", _ANY_DATASET, "num_workers is for a dataset the Trainer batches; " + _MAKES_ITS_OWN +
             " (DataLoader(..., num_workers=...))"))


@dataclasses.dataclass(frozen=True)
class OptimizationSettings:
    """The loss, the run's length, the optimizer given by name, its schedule and the update of each step."""

    loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = _shared(
        "step.loss_fn", rule=rules.loss_fn, doc="Hugging Face's rule for dict batches; a subclass may override "
        "compute_loss instead.")
    max_iter: Optional[int] = _row(None, integer(1), "Iterations to train (one iteration = one optimizer update).")
    max_epochs: Optional[int] = _row(None, integer(1), "Passes over the data; with max_iter, whichever comes first.",
        Need("epochs", _EPOCHS, "max_epochs needs data with a length; this train_loader has none, so give max_iter"))
    scheduler: Any = _row(None, None, "A torch scheduler, an fvcore ParamScheduler, a factory (optimizer[, max_iter]), "
        "a name ('cosine', 'linear', 'step', 'constant') or (name, options); None: the rate is the optimizer's.",
        Need("the optimizer trained", lambda s, v: s.scheduler_fits,
             "the scheduler ({scheduler_type}) was built on another optimizer than the one trained, so it would "
             "never change the learning rate: build it on that optimizer, or give a factory (scheduler=lambda "
             "optimizer: ...) or a name"))
    scheduler_interval: str = _row(
        "iter", choice(("iter", "epoch")), "When a torch scheduler steps: 'iter' or 'epoch'.",
        Need("a scheduler", lambda s, v: s.scheduler != "none",
             "scheduler_interval={value} says when a scheduler steps, and no scheduler is given", refuse=False),
        Need("a torch scheduler", lambda s, v: v != "epoch" or s.scheduler not in ("name", "fvcore"),
             "scheduler_interval='epoch' is for torch schedulers; a named or fvcore schedule is per iteration"),
        Need("epochs", lambda s, v: v != "epoch" or _EPOCHS(s, v),
             "scheduler_interval='epoch' needs epochs, and this train_loader has no length"))
    warmup_iters: int = _row(0, integer(0), "A linear warm-up from 0 to the full rate (Hugging Face's) before a "
        "schedule the Trainer builds (scheduler=None or a name).",
        Need("a schedule the Trainer builds", lambda s, v: s.scheduler in ("none", "name"),
             "warmup_iters={value} warms up a schedule the Trainer builds (scheduler=None or a name such as "
             "'cosine'); this scheduler sets every rate itself: build the warm-up into it"))
    lr: Optional[float] = _row(
        None, positive_number(), "The learning rate of an optimizer given by name (required then).",
        Need("a named optimizer", _NAMED_OPTIMIZER,
             "lr is for an optimizer given by name; this optimizer has its own learning rate"))
    weight_decay: float = _row(0.0, non_negative_number, "The weight decay of an optimizer given by name.",
        Need("a named optimizer", _NAMED_OPTIMIZER,
             "weight_decay is for an optimizer given by name; this optimizer has its own (give it there)"))
    no_decay_norm_and_bias: bool = _row(
        True, boolean, "treadle's default for an optimizer given by name: normalization "
        "layers and biases get no weight decay (as Hugging Face's Trainer); False decays every parameter.",
        Need("a named optimizer", _NAMED_OPTIMIZER,
             "no_decay_norm_and_bias is for an optimizer given by name; this optimizer has its own parameter groups"),
        Need("a weight decay", lambda s, v: bool(s["weight_decay"]),
             "no_decay_norm_and_bias={value} has no effect without a weight_decay", refuse=False))
    precision: str = _shared("step.precision",
        Need("CUDA", lambda s, v: v != "fp16" or s.cuda,
             "precision='fp16' needs a CUDA device (it trains with a GradScaler); use 'bf16' on this machine"))
    grad_accum_steps: int = _shared("step.grad_accum_steps")
    clip_grad_norm: Optional[float] = _shared("step.clip_grad_norm",
        Need("no clip_grad_value", lambda s, v: s["clip_grad_value"] is None,
             "clip_grad_norm={value} and clip_grad_value={clip_grad_value}: clip by norm or by value, not both"))
    clip_grad_value: Optional[float] = _shared("step.clip_grad_value")
    compile: Union[bool, Dict[str, Any]] = _row(
        False, rules.compile_options, "Run each step through torch.compile (CompiledStep); a dict is "
        "passed to torch.compile.")
    ema_decay: Optional[float] = _shared("ema.decay",
        Need("not FSDP", lambda s, v: wrapper_of(s["ddp"])[0] != "fsdp",
             "ema_decay is not supported with ddp='fsdp': the EMA keeps an unsharded copy of the weights"),
        default=None, doc="None: no EMA; else evaluate with the averaged weights.")


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """What is evaluated, when, and what is watched in the results (the best checkpoint, early stopping)."""

    # Any, as train_loader: a torch Dataset (batched here) is no Iterable to mypy.
    eval_loader: Any = _row(
        None, None, "What evaluation reads: batches, or a dataset batched by eval_batch_size.")
    metrics: Sequence[Any] = _row(
        (), rules.metrics, "What evaluation computes (default ['loss']): metric names, (name, options), "
        "torchmetrics objects or DatasetEvaluators; also what evaluate(loader) computes.",
        Need("an evaluation set", lambda s, v: s.eval != "none",
             "metrics={value} are computed by evaluation, and no eval_loader is given: they act only in "
             "evaluate(loader)", refuse=False))
    eval_period: Optional[int] = _shared("eval_period",
        Need("an evaluation set", _watches_an_evaluation,
             "eval_period={value} is when eval_loader is evaluated, and no eval_loader is given"),
        default=None, doc="None: every epoch when the epoch length is known. Without eval_loader, when a "
        "training best_metric ('train/loss') is read.")
    best_metric: Optional[str] = _row(
        None, text(empty=False, none=True), "Save model_best.pth when this evaluation result "
        "improves ('eval/', 'evaluation.', 'eval_' prefixes accepted; 'train/...', 'train.', 'train_' name a "
        "training scalar, which needs no eval_loader: read every eval_period iterations, by default each epoch, as "
        "its mean over them, the history's train_loss).",
        Need("an evaluation set", _watches_an_evaluation,
             "best_metric and early_stopping_patience watch an evaluation: give eval_loader"),
        Need("a period to read it", _watched_training_scalar_is_read,
             "best_metric={value} is a training scalar, read without an eval_loader every eval_period iterations "
             "(default: each epoch), and this train_loader has no length (no epochs): give eval_period"),
        Need("output_dir", _OUTPUT_DIR, "best_metric saves model_best.pth: give output_dir"))
    best_mode: Optional[str] = _shared("best_checkpointer.mode",
        Need("a watched metric", lambda s, v: s["best_metric"] is not None or s["early_stopping_patience"],
             "best_mode={value} is the direction of best_metric and early stopping, and neither is given"))
    early_stopping_patience: Optional[int] = _row(
        None, integer(1), "Stop after that many evaluations without improvement of "
        "best_metric (or of the evaluation loss); of a training best_metric, that many readings.",
        Need("an evaluation set", _watches_an_evaluation,
             "best_metric and early_stopping_patience watch an evaluation: give eval_loader"))
    evaluate_with_generate: Union[bool, Dict[str, Any]] = _row(
        False, rules.bool_or_dict, "Score the metrics on model.generate()'s outputs; a dict "
        "is passed to generate(). The evaluation 'loss', where asked for, is the forward's.",
        Need("a model that generates", lambda s, v: not v or s.generates,
             "evaluate_with_generate needs a model with a generate() method; this model has none"),
        Need("a metric of the generated tokens", lambda s, v: not v or _scores_outputs(s["metrics"]),
             "evaluate_with_generate scores the metrics on model.generate()'s outputs, and the metrics ask for "
             "the forward's loss only: give a metric of the generated tokens (('cer', {{'decode': fn}}))"))


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """The run's folder, the checkpoints written into it, and the weights loaded first."""

    output_dir: Optional[str] = _row(
        None, path(empty=False, none=True), "The run's folder: checkpoints, metrics, log.txt; "
        "nothing is written without it.")
    checkpoints_dir: Optional[str] = _row(
        None, path(empty=False, none=True, inside=True), "A folder inside output_dir for the checkpoints.",
        Need("output_dir", _OUTPUT_DIR, "checkpoints_dir/logs_dir ({value}) are folders inside output_dir: give "
             "output_dir"))
    checkpoint_period: Optional[int] = _shared("checkpointer.period",
        Need("output_dir", _OUTPUT_DIR, "checkpoint_period={value} saves checkpoints, and " + _NOT_WRITTEN,
             refuse=False),
        default=None, doc="None: every epoch (Hezar's default).")
    max_to_keep: Optional[int] = _shared("checkpointer.max_to_keep",
        Need("output_dir", _OUTPUT_DIR, "max_to_keep={value} keeps periodic checkpoints, and " + _NOT_WRITTEN,
             refuse=False),
        Need("periodic checkpoints", lambda s, v: s["checkpoint_period"] != 0,
             "max_to_keep={value} keeps periodic checkpoints, and checkpoint_period=0 writes none",
             refuse=False))
    preemption: bool = _shared("handle_preemption",
        Need("output_dir", lambda s, v: not v or s["output_dir"] is not None,
             "preemption={value} saves a checkpoint on SIGTERM/SIGUSR1, and " + _NOT_WRITTEN, refuse=False),
        doc="With output_dir (where checkpoints are written): a preempted run is resumed exactly by "
        "train(resume=True). False: the signal ends the process as Python's default does.")
    init_weights_from: Optional[str] = _row(
        None, path(empty=False, none=True), "A checkpoint whose matching weights are loaded "
        "first (a new head is fine: mismatched keys are reported).")


@dataclasses.dataclass(frozen=True)
class LoggingSettings:
    """What the run writes and shows as it trains, and the hooks and callbacks that follow it."""

    logs_dir: Optional[str] = _row(
        None, path(empty=False, none=True, inside=True), "A folder inside output_dir for the logs and metrics.",
        Need("output_dir", _OUTPUT_DIR, "checkpoints_dir/logs_dir ({value}) are folders inside output_dir: give "
             "output_dir"))
    loggers: Sequence[Any] = _row(
        ("json", "tensorboard"), rules.loggers, "The files written ('json', 'tensorboard', 'csv'), "
        "trackers ('mlflow', 'wandb') or EventWriter objects.",
        Need("output_dir", lambda s, v: s["output_dir"] is not None or not any(n in FILE_LOGGERS for n in v),
             "loggers={value} names files, and " + _NOT_WRITTEN, refuse=False))
    log_period: int = _shared("log_period")
    progress_bar: Optional[bool] = _row(
        None, choice((None, True, False)), "A tqdm bar; None: shown when stderr is a terminal.")
    hooks: Sequence[HookBase] = _row((), rules.hooks, "More hooks (HookBase), placed by docs/defaults.md's rule.")
    callbacks: Sequence[EpochCallback] = _row(
        (), rules.callbacks, "fn(trainer, epoch, metrics) at each epoch's end, with that epoch's row.",
        Need("epochs", _EPOCHS,
             "callbacks are called at each epoch's end, and this train_loader has no length (no epochs)"))


@dataclasses.dataclass(frozen=True)
class ProcessSettings:
    """Where the run trains: the device, the random seed, and the model's wrapper and timeout on several processes."""

    device: Union[str, torch.device] = _shared("device", rule=rules.device, doc="A torch.device is taken too.")
    seed: Optional[int] = _row(
        None, rules.seed, "Seeds python, numpy and torch before training, and the data order; None: not seeded "
        "(the data order then uses 0).")
    ddp: Union[str, Dict[str, Any]] = _row(
        "ddp", rules.ddp, "How the model is wrapped when several processes train: 'ddp', 'fsdp' or a dict of "
        "train.ddp's options with its kind.",
        Need("several processes", _SEVERAL_PROCESSES, "ddp={value} wraps the model when several processes train; "
             "this is one process, so nothing is wrapped", refuse=False))
    dist_timeout: float = _shared("dist_timeout",
        Need("several processes", _SEVERAL_PROCESSES, "dist_timeout={value} bounds what several processes wait "
             "for each other; this is one process", refuse=False),
        default=float(_TRAIN["dist_timeout"].default))  # in seconds, as timedelta.total_seconds() says them
    num_threads: Union[int, str, None] = _shared(
        "num_threads", doc="Set while train() runs (after it, the count before is put back).")


class TrainerSettingsDict(TypedDict, total=False):
    """The settings as the ``Trainer`` takes them, for mypy and editors:
    ``Trainer.__init__``'s ``**settings: Unpack[TrainerSettingsDict]``, so a
    misspelt name or a value of the wrong type is named where it is typed.
    A subclass types its own ``**settings`` so too.

    Every key is optional (a setting not given keeps its default), and each
    is typed as its group's field is (:class:`DataSettings`... :class:`ProcessSettings`),
    except that a path setting also takes an ``os.PathLike`` (the ``Trainer``
    reads it as its string).
    ``tests/trainer/test_typed_settings.py`` checks the two say the same.
    """

    # DataSettings
    batch_size: Optional[int]
    total_batch_size: Optional[int]
    eval_batch_size: Optional[int]
    shuffle: bool
    collate_fn: Optional[Callable[[list], Any]]
    num_workers: int
    # OptimizationSettings
    loss_fn: Optional[Callable[[Any, Any], torch.Tensor]]
    max_iter: Optional[int]
    max_epochs: Optional[int]
    scheduler: Any
    scheduler_interval: str
    warmup_iters: int
    lr: Optional[float]
    weight_decay: float
    no_decay_norm_and_bias: bool
    precision: str
    grad_accum_steps: int
    clip_grad_norm: Optional[float]
    clip_grad_value: Optional[float]
    compile: Union[bool, Dict[str, Any]]
    ema_decay: Optional[float]
    # EvaluationSettings
    eval_loader: Any
    metrics: Sequence[Any]
    eval_period: Optional[int]
    best_metric: Optional[str]
    best_mode: Optional[str]
    early_stopping_patience: Optional[int]
    evaluate_with_generate: Union[bool, Dict[str, Any]]
    # CheckpointSettings
    output_dir: Optional[Union[str, os.PathLike[str]]]
    checkpoints_dir: Optional[Union[str, os.PathLike[str]]]
    checkpoint_period: Optional[int]
    max_to_keep: Optional[int]
    preemption: bool
    init_weights_from: Optional[Union[str, os.PathLike[str]]]
    # LoggingSettings
    logs_dir: Optional[Union[str, os.PathLike[str]]]
    loggers: Sequence[Any]
    log_period: int
    progress_bar: Optional[bool]
    hooks: Sequence[HookBase]
    callbacks: Sequence[EpochCallback]
    # ProcessSettings
    device: Union[str, torch.device]
    seed: Optional[int]
    ddp: Union[str, Dict[str, Any]]
    dist_timeout: float
    num_threads: Union[int, str, None]


@dataclasses.dataclass(frozen=True)
class TrainerSettings:
    """The settings of a ``Trainer`` (``trainer.settings``), checked, by
    purpose: ``trainer.settings.evaluation.eval_period``. Built once, when
    the ``Trainer`` is built (:func:`checked_settings`), and read-only.

    A setting read by its name alone (``settings.eval_period``) still
    answers, for code written for treadle 0.8.0, which had no groups: each
    such read warns (a ``DeprecationWarning`` naming the grouped path), mypy
    reports it (no such attribute), and treadle 0.10 removes it. treadle
    itself reads its settings by group.
    """

    data: DataSettings
    optimization: OptimizationSettings
    evaluation: EvaluationSettings
    checkpoints: CheckpointSettings
    logging: LoggingSettings
    processes: ProcessSettings

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "TrainerSettings":
        """The settings of ``values``, one value by setting name."""
        return cls(**{name: group(**{f.name: values[f.name] for f in dataclasses.fields(group)})
                      for name, group in GROUPS})

    if not TYPE_CHECKING:  # so that mypy names a flat read as an error, not an Any

        def __getattr__(self, name: str) -> Any:
            # Called only for what is not an attribute: a setting's name alone,
            # as 0.8.0 read it (kept one minor version, warned).
            if name not in _BY_NAME:
                raise AttributeError(f"{type(self).__name__} has no setting {name!r}")
            group = _BY_NAME[name].group
            warn_deprecated("trainer.settings.{name}", name=name, group=group)
            return getattr(object.__getattribute__(self, group), name)


#: The groups of :class:`TrainerSettings`, in order: ``(name, dataclass)``.
GROUPS: Tuple[Tuple[str, Any], ...] = tuple(
    (f.name, typing.get_type_hints(TrainerSettings)[f.name]) for f in dataclasses.fields(TrainerSettings)
)

#: Every setting of ``Trainer`` (its arguments after ``model, optimizer,
#: train_loader``), group by group: the rows of the groups' fields.
SETTINGS: Tuple[Setting, ...] = tuple(
    dataclasses.replace(f.metadata[_ROW], name=f.name, group=name)
    for name, group in GROUPS for f in dataclasses.fields(group)
)

_BY_NAME: Dict[str, Setting] = {row.name: row for row in SETTINGS}

#: The settings whose field holds an integer (or None), by its annotation
#: (resolving all of them would import torch).
_INTEGERS: Tuple[str, ...] = tuple(
    f.name for _, group in GROUPS for f in dataclasses.fields(group) if f.type in ("int", "Optional[int]")
)


def setting(name: str) -> Setting:
    """The row of ``name``."""
    return _BY_NAME[name]


def wrapper_of(ddp: Any) -> Tuple[str, Dict[str, Any]]:
    """The wrapper's kind and options from ``ddp=``: a kind, or ``train.ddp``'s dict with its ``kind``."""
    if isinstance(ddp, Mapping):
        options = dict(ddp)
        return options.pop("kind", "ddp"), options
    return ddp, {}


def _scores_outputs(metrics: Sequence[Any]) -> bool:
    """Whether ``metrics`` hold one that reads the model's outputs (not only the loss)."""
    return any(not (m == "loss" if isinstance(m, str) else False) for m in (metrics or ["loss"]))


def _format(template: str, name: str, value: Any, situation: Situation) -> str:
    fields = {key: repr(v) for key, v in situation.values.items()}
    return template.format(name=name, value=repr(value), train=situation.train_type, eval=situation.eval_type,
                           scheduler_type=type(situation["scheduler"]).__name__, **fields)


def check_settings(situation: Situation, given: FrozenSet[str]) -> Dict[str, Any]:
    """Checks the ``given`` settings of ``situation.values``: each value by its
    row's rule, then what it needs. Returns the values, integral floats made
    ints (``1e3`` from a config file).

    Raises:
        ConfigError: (a ``ValueError``) the first setting whose value its rule
            refuses, or that cannot act here and is refused, in one line.
    Logs one warning for each setting that cannot act here and is warned about.
    """
    values = dict(situation.values)
    for row in SETTINGS:
        value = values[row.name]
        if row.name in given and row.rule is not None and not (value is None and row.default is None):
            row.rule(row.name, value)
            if isinstance(value, os.PathLike):  # a path setting's pathlib.Path is used as its string
                values[row.name] = value = os.fspath(value)
            if row.rule is not rules.seed and is_int(value) and isinstance(value, float) and isinstance(row.default, int):
                values[row.name] = int(value)
    situation = dataclasses.replace(situation, values=values)
    warnings = []
    for row in SETTINGS:
        if row.name not in given or values[row.name] in ((), []):  # an empty list asks for nothing
            continue
        for need in row.needs:
            if need.holds(situation, values[row.name]):
                continue
            message = _format(need.message, row.name, values[row.name], situation)
            if need.refuse:
                raise ConfigError(message)
            warnings.append(message)
            break
    for message in warnings:
        logger.warning(message)
    return values


def given_settings(settings: Mapping[str, Any]) -> Tuple[Dict[str, Any], FrozenSet[str]]:
    """Every setting's value, ``settings`` (a ``Trainer``'s keyword arguments)
    over the defaults, and which of them its caller gave: a setting passed at
    its default value may still be one that cannot act here. ``None`` passed
    for a setting asks for nothing, and does not count.

    Raises:
        TypeError: a name that is no setting, as Python says it of an
            argument a function does not have; another trainer's name of a
            setting (:data:`~treadle.compat.names.SEED_SETTINGS`) with treadle's.
    """
    unknown = [name for name in settings if name not in _BY_NAME]
    if unknown:
        hint = seed_setting_hint(unknown[0])
        raise TypeError(f"Trainer.__init__() got an unexpected keyword argument {unknown[0]!r}"
                        + (f": {hint}" if hint else ""))
    values = {row.name: settings.get(row.name, row.default) for row in SETTINGS}
    for name in _INTEGERS:
        # A whole float (8.0, 1e3) is the integer it holds, as a config's value is
        # (treadle.config.rules.is_int); left a float, it failed later, named
        # as another setting (total_batch_size for batch_size).
        if isinstance(values[name], float) and values[name].is_integer():
            values[name] = int(values[name])
    return values, frozenset(name for name, value in settings.items() if value is not None)


def situation_of(model: Any, optimizer: Any, train_loader: Any, values: Mapping[str, Any]) -> Situation:
    """The :class:`Situation` of a ``Trainer(model, optimizer, train_loader, **values)``.

    Raises:
        TypeError: ``optimizer`` is not an optimizer, a name or (name, options),
            or the data is not iterable.
    """
    import torch
    from fvcore.common.param_scheduler import ParamScheduler

    from .data import data_kind

    named = isinstance(optimizer, str) or (
        isinstance(optimizer, tuple) and len(optimizer) == 2 and isinstance(optimizer[0], str)
        and isinstance(optimizer[1], Mapping)
    )
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        name = optimizer.__name__
        where = "torch.optim." if optimizer.__module__.startswith("torch.optim") else ""
        raise TypeError(f"optimizer={name} is a class: give an instance, {where}{name}(model.parameters(), "
                        f"lr=...), or a name with lr= ('sgd', 'adam', 'adamw')")
    if not named and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch optimizer, a name or (name, options), got {optimizer!r}")
    scheduler = values["scheduler"]
    if scheduler is None:
        scheduler_kind = "none"
    elif isinstance(scheduler, (str, tuple)):
        scheduler_kind = "name"
    elif isinstance(scheduler, ParamScheduler):
        scheduler_kind = "fvcore"
    else:
        scheduler_kind = "torch" if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) else "factory"
    device = values["device"]
    return Situation(
        train=data_kind(train_loader), eval=data_kind(values["eval_loader"], "eval_loader"),
        train_type=type(train_loader).__name__, eval_type=type(values["eval_loader"]).__name__,
        optimizer="name" if named else "object", scheduler=scheduler_kind, processes=processes_to_come(),
        scheduler_fits=scheduler_kind != "torch" or scheduler.optimizer is optimizer,
        cuda=str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available()),
        generates=callable(getattr(model, "generate", None)), values=values,
    )


def checked_settings(model: Any, optimizer: Any, train_loader: Any, values: Mapping[str, Any],
                     given: FrozenSet[str]) -> TrainerSettings:
    """The settings of ``Trainer(model, optimizer, train_loader, **values)``,
    ``given`` by its caller, checked before anything is built or written:
    by the table (:func:`check_settings`), the batch size a dataset needs,
    and the output folder's (and its subfolders') being writable."""
    from treadle.utils.run_folder import check_output_dir

    from .data import check_batch_sizes

    s = TrainerSettings.of(check_settings(situation_of(model, optimizer, train_loader, values), given))
    data, output_dir = s.data, s.checkpoints.output_dir
    check_batch_sizes(train_loader, s.evaluation.eval_loader, data.batch_size, data.total_batch_size, data.eval_batch_size)
    if output_dir is not None:
        check_output_dir(output_dir)
        for name, sub in (("checkpoints_dir", s.checkpoints.checkpoints_dir), ("logs_dir", s.logging.logs_dir)):
            if sub:
                check_output_dir(os.path.join(output_dir, sub), name=name)
    return s


def replaced_settings(built: TrainerSettings, new: Any) -> str:
    """The one line refusing ``trainer.settings = new`` once the ``Trainer`` is
    built from ``built``: its parts (hooks, writers, step, loaders) were made
    from those, and would never read ``new``. Names the settings ``new``
    changes (those :func:`dataclasses.replace` gave another value)."""
    changed = [f"{row.name}={getattr(getattr(new, row.group), row.name)!r}" for row in SETTINGS
               if isinstance(new, TrainerSettings)
               and getattr(getattr(new, row.group), row.name) is not getattr(getattr(built, row.group), row.name)]
    given = ", ".join(changed) if changed else repr(new) if not isinstance(new, TrainerSettings) else "new ones"
    wanted = ", ".join(changed) if changed else "the settings you want, as keyword arguments"
    return (f"trainer.settings cannot be replaced once the Trainer is built: its hooks, writers, step and loaders "
            f"were built from the settings it was given and would never read {given}; build a new Trainer with "
            f"{wanted} (Trainer(model, optimizer, train_loader, ..., {', '.join(changed) or 'log_period=...'}))")


def processes_to_come() -> int:
    """How many processes train: the joined group's size, or torchrun's
    ``WORLD_SIZE`` before the group is joined."""
    from treadle.utils import comm

    if comm.get_world_size() > 1:
        return comm.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)
