"""The plain-object trainer: treadle's loop without configs.

For users of Hezar's ``Trainer``, pytorch-accelerated or a small
``Trainer(model, optimizer, loss_fn)`` class: the same engine, hooks, writers,
checkpoints and run session as :class:`~treadle.engine.DefaultTrainer`, from
objects. Its settings, their defaults and what each needs are one table,
:mod:`treadle.trainer.settings`; its data, :mod:`treadle.trainer.data`;
its evaluation, :mod:`treadle.trainer.evaluation`; its run in its folder,
:mod:`treadle.engine.session`.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import types
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Union

import torch
from torch import nn

from treadle.checkpoint import CheckpointError, Checkpointer, unwrap_model
from treadle.checkpoint import init_weights_from as load_matching_weights
from treadle.config.rules import path as path_rule
from treadle.events import EventWriter, get_default_writers
from treadle.evaluation.batch import batch_size
from treadle.evaluation.inference import inference_context
from treadle.hooks import HookBase, LRScheduler
from treadle.utils import comm
from treadle.utils.device import resolve_device
from treadle.utils.env import seed_all_rng
from treadle.utils.logger import setup_logger
from treadle.utils.run_folder import RunFolder

from treadle.solver import build_optimizer

from treadle.engine.build import build_step, loader_epoch_length, resolve_scheduler
from treadle.engine.default_hooks import default_hooks
from treadle.engine.hook_table import note_origin
from treadle.compat.names import HEZAR, HUGGING_FACE, SEED_METHODS, compute_loss_seed, overridden, refuse_methods_set_on_instance
from treadle.compat.names import refuse_libai_run_step, refuse_seed_methods
from treadle.compat.overrides import EVAL_POINTS, TRAIN_EPOCH_EVENTS, UPDATE_POINTS, RunEvents, SeedEventCalls, SeedOverrides
from treadle.compat.overrides import TrainEvents
from treadle.compat.step import TrainerStep
from treadle.compat.overrides import is_event_callback, raised_in
from treadle.engine.history import EpochCallback, RunHistory, TrainingHistory, iteration_history
from treadle.engine.data_parallel import check_optimizer_holds, wrap_model
from treadle.engine.launch import DEFAULT_TIMEOUT, join_env_process_group
from treadle.engine.session import Resume, RunSession
from treadle.engine.steps import EagerStep, StepBase
from treadle.engine.train_loop import TrainerBase
from .data import as_eval_loader, as_train_loader, check_batch_sizes, run_length, warn_about_leftover_batches
from .evaluation import TrainerEvaluation, watches_training
from .settings import FILE_LOGGERS, LOGGERS, SETTINGS, checked_settings, records_given_settings, wrapper_of

__all__ = ["Trainer", "TrainingHistory", "LOGGERS", "SEED_METHODS"]

logger = logging.getLogger(__name__)

# Per-iteration history is kept in memory for the returned history; beyond
# this many iterations the oldest values are dropped (global averages stay).
_MAX_HISTORY = 1_000_000

class Trainer(SeedOverrides, TrainerBase):
    """Trains ``model`` from plain objects and returns its history.

    Example::

        trainer = Trainer(model, "adamw", train_dataset, batch_size=64, lr=1e-3,
                          loss_fn=F.cross_entropy, eval_loader=val_dataset,
                          metrics=["accuracy", "f1"], max_epochs=5, output_dir="out",
                          best_metric="accuracy", early_stopping_patience=3)
        history = trainer.train()
        print(history.epochs[-1]["accuracy"])

    Every setting acts, or is refused (a ``ValueError``) or warned about in
    one line when the ``Trainer`` is built, before anything is written: the
    table of :mod:`treadle.trainer.settings`, shown in
    ``docs/trainer.md``; ``docs/migrating.md`` maps the seeds' names to these.
    A subclass overrides the methods the seeds document (qurious'
    ``train_step``, pytorch-accelerated's ``calculate_train_batch_loss``,
    Hezar's ``training_step``...): each is called at the seed's moment, or
    refused when the subclass is built (the table of
    :mod:`treadle.compat.names`; the defaults are :class:`SeedOverrides`'s).
    Under ``torchrun`` (or :func:`~treadle.engine.launch`) the same script
    trains one model on every process (``docs/distributed.md``).

    Args:
        model: the module to train; moved to ``device``.
        optimizer: a torch optimizer, or ``"sgd"``/``"adam"``/``"adamw"``: torch's class with
            torch's defaults (no momentum for sgd), or ``("sgd", {"momentum": 0.9})``.
        train_loader: batches (a ``DataLoader``, a generator: an iterable that is not a list), or a
            dataset (a torch ``Dataset``, a list of samples) batched by ``batch_size``.
        loss_fn: ``loss_fn(model(inputs), targets)`` on ``(inputs, targets)`` batches,
            ``loss_fn(model(**rest), batch["labels"])`` on dict batches (``rest``: the batch without
            its labels); without it the model returns its loss (``model(**batch)`` for a dict).
        eval_loader: batches, or a dataset batched by ``eval_batch_size``,
            evaluated every ``eval_period`` iterations and at the end.
        metrics: what evaluation computes (default ``["loss"]``): names, ``(name,
            options)``, torchmetrics objects or ``DatasetEvaluator`` objects (without an
            ``eval_loader``, only ``evaluate(loader)``'s, with a warning).
        max_iter, max_epochs: the run length; with both, whichever comes first.
        scheduler: a torch scheduler (on this optimizer), a ``ParamScheduler``, a factory
            ``(optimizer[, max_iter])``, ``"cosine"``, ``"linear"``, ``"step"``,
            ``"constant"`` or ``(name, options)``; None: the optimizer's rate.
        scheduler_interval: when a torch scheduler steps: ``"iter"`` or ``"epoch"``.
        warmup_iters: a linear warm-up from 0 (Hugging Face's) before a
            schedule the Trainer builds (a name, or none: constant).
        lr, weight_decay: of an optimizer given by name.
        no_decay_norm_and_bias: treadle's one default for an optimizer given
            by name: norms and biases get no weight decay; False decays all.
        batch_size: a dataset's batch per process (the seeds' convention).
        total_batch_size: instead, the batch of one step over all processes.
        eval_batch_size: an evaluation dataset's batch (default: the
            training batch per process).
        shuffle, collate_fn, num_workers: how a dataset is batched (Hezar's
            ``data_collator`` is ``collate_fn``).
        hooks: more hooks, placed by the rule of ``docs/defaults.md``.
        callbacks: ``fn(trainer, epoch, metrics)`` at each epoch's end, or callback
            objects with pytorch-accelerated's ``on_*`` events (hooks may have them too).
        output_dir: the run's folder (checkpoints, ``metrics.json``, ``log.txt``);
            nothing is written without it.
        checkpoints_dir, logs_dir: subfolders of ``output_dir`` (Hezar's layout).
        loggers: the files (``"json"``, ``"tensorboard"``, ``"csv"``), the
            trackers (``"mlflow"``, ``"wandb"``) or ``EventWriter`` objects.
        precision, grad_accum_steps, clip_grad_norm, clip_grad_value: as
            ``EagerStep`` (clipping by norm or by value, not both).
        compile: use ``CompiledStep``; a dict is passed to ``torch.compile``.
        device: ``"auto"`` (cuda, mps, cpu), or a device.
        seed: seeds python, numpy and torch before training, and the data order.
        log_period, eval_period, checkpoint_period: in iterations
            (``eval_period`` and ``checkpoint_period`` default to an epoch).
        max_to_keep: periodic checkpoints kept.
        preemption: with ``output_dir``, on SIGTERM/SIGUSR1 save a checkpoint when the iteration ends and
            exit with status 75 (:class:`~treadle.hooks.PreemptionHandler`, as ``tools/train_net.py``);
            ``train(resume=True)`` then resumes exactly. False: the signal ends the process.
        ema_decay: keep an EMA of the weights and evaluate with it.
        best_metric: save ``model_best.pth`` when this result improves (``"eval/"``,
            ``"eval_"``... accepted; ``"train/..."`` names a training scalar, which needs no
            ``eval_loader``: read every ``eval_period``, by default each epoch, as its mean over
            those iterations: an epoch's is the history's ``train_loss``).
        best_mode: ``"min"``/``"max"``, against the direction inferred.
        early_stopping_patience: stop after that many evaluations without
            improvement of ``best_metric`` (or of the evaluation ``loss``).
        init_weights_from: a checkpoint whose matching weights are loaded first.
        progress_bar: a tqdm bar; ``None`` shows it when stderr is a terminal.
        evaluate_with_generate: score the metrics on ``model.generate()``'s outputs (a
            dict: its options); a ``loss`` asked for is the forward's.
        ddp: the wrapper on several processes: ``"ddp"``, ``"fsdp"`` or a
            dict of ``train.ddp``'s options with its ``kind``.
        dist_timeout: seconds the processes wait for each other (set-up and collectives).
    """

    #: The settings the caller passed (set by ``records_given_settings``).
    _given_settings: FrozenSet[str] = frozenset()

    @records_given_settings
    def __init__(
        self,
        model: nn.Module,
        optimizer: Union[torch.optim.Optimizer, str, tuple],
        train_loader: Iterable[Any],
        *,
        loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None,
        eval_loader: Optional[Iterable[Any]] = None,
        metrics: Sequence[Any] = (),
        max_iter: Optional[int] = None,
        max_epochs: Optional[int] = None,
        scheduler: Any = None,
        scheduler_interval: str = "iter",
        warmup_iters: int = 0,
        lr: Optional[float] = None,
        weight_decay: float = 0.0,
        no_decay_norm_and_bias: bool = True,
        batch_size: Optional[int] = None,
        total_batch_size: Optional[int] = None,
        eval_batch_size: Optional[int] = None,
        shuffle: bool = True,
        collate_fn: Optional[Callable[[list], Any]] = None,
        num_workers: int = 0,
        hooks: Sequence[HookBase] = (),
        callbacks: Sequence[EpochCallback] = (),
        output_dir: Optional[str] = None,
        checkpoints_dir: Optional[str] = None,
        logs_dir: Optional[str] = None,
        loggers: Sequence[Any] = ("json", "tensorboard"),
        precision: str = "fp32",
        grad_accum_steps: int = 1,
        clip_grad_norm: Optional[float] = None,
        clip_grad_value: Optional[float] = None,
        compile: Union[bool, Dict[str, Any]] = False,
        device: Union[str, torch.device] = "auto",
        seed: Optional[int] = None,
        log_period: int = 20,
        eval_period: Optional[int] = None,
        checkpoint_period: Optional[int] = None,
        max_to_keep: Optional[int] = 3,
        preemption: bool = True,
        ema_decay: Optional[float] = None,
        best_metric: Optional[str] = None,
        best_mode: Optional[str] = None,
        early_stopping_patience: Optional[int] = None,
        init_weights_from: Optional[str] = None,
        progress_bar: Optional[bool] = None,
        evaluate_with_generate: Union[bool, Dict[str, Any]] = False,
        ddp: Union[str, Dict[str, Any]] = "ddp",
        dist_timeout: float = DEFAULT_TIMEOUT.total_seconds(),
    ) -> None:
        arguments = locals()
        self._build(model, optimizer, train_loader, {row.name: arguments[row.name] for row in SETTINGS})

    def _build(self, model: nn.Module, optimizer: Any, train_loader: Any, values: Dict[str, Any]) -> None:
        """The constructor's jobs, in order: check every setting, then build."""
        # The console first, so that what the checks warn about shows as every record does (and reaches
        # log.txt, which starts when train() has claimed the folder: nothing is written into it before).
        rank = comm.get_rank() if comm.get_world_size() > 1 else int(os.environ.get("RANK", "0") or 0)
        setup_logger(output=_logs_dir(values), distributed_rank=rank, defer_file=True)
        s = self.settings = checked_settings(model, optimizer, train_loader, values, self._given_settings)
        # Under torchrun the processes meet here (launch() has joined them before calling the user's function).
        join_env_process_group(datetime.timedelta(seconds=s.dist_timeout), leave_at_exit=True)
        self.output_dir = s.output_dir
        self.checkpoint_dir, self.logs_dir = _inside(s.output_dir, s.checkpoints_dir), _inside(s.output_dir, s.logs_dir)
        events = self._check_overrides(s)
        if s.seed is not None:
            seed_all_rng(s.seed)
        self.device = resolve_device(s.device)
        self.model = self.build_model(model, s)
        self.optimizer = self.build_optimizer(optimizer, unwrap_model(self.model), s)
        self.loss_fn = s.loss_fn
        self.train_loader, self.eval_loader = self.build_loaders(train_loader, s.eval_loader, s)
        epoch_length = loader_epoch_length(self.train_loader, s.grad_accum_steps)
        _check_epoch_events(events, epoch_length)
        max_iter = run_length(s.max_iter, s.max_epochs, epoch_length)
        if s.max_epochs is not None:
            warn_about_leftover_batches(self.train_loader, s.grad_accum_steps, epoch_length)
        super().__init__(self.build_step(s), history_length=min(max(max_iter, 10_000), _MAX_HISTORY))
        self.max_iter, self.epoch_length = max_iter, epoch_length
        self.history = TrainingHistory()
        self.run_history = RunHistory(self.history)
        self._pause_after_epoch: Optional[int] = None
        self._trained = self._paused = False
        # Whether train_epoch() has trained (train() after it says so).
        self._by_epochs = False
        self.evaluation = self.build_evaluation(s)
        #: What evaluation computes (the list given as ``metrics``); a subclass may
        #: use the name for its own (pytorch-accelerated's ``TrainerWithMetrics``).
        self.metrics: Any = self.evaluation.metrics
        self.checkpointer = self.build_checkpointer() if s.output_dir is not None else None
        self.session = RunSession(
            s.output_dir, self._checkpoint_io(), folder_names=RunFolder.TRAINER_API,
            subdirs=[d for d in (s.checkpoints_dir, s.logs_dir) if d],
        )
        self.register_hooks(self.build_hooks(s))
        self._in_training = False
        events.fire("init_end")

    # ------------------------------------------------------------------ builders
    def build_model(self, model: nn.Module, s: types.SimpleNamespace) -> nn.Module:
        """``model`` on the device, with ``init_weights_from``'s weights, wrapped on several processes."""
        model.to(self.device)
        if s.init_weights_from:
            try:
                load_matching_weights(model, s.init_weights_from)
            except CheckpointError as e:  # the checkpoint's words name the file; the setting is said too
                raise type(e)(f"init_weights_from={s.init_weights_from!r}: {e}") from None
        kind, options = wrapper_of(s.ddp)
        return wrap_model(model, kind, setting="ddp", **options)

    def build_optimizer(self, optimizer: Any, model: nn.Module, s: types.SimpleNamespace) -> torch.optim.Optimizer:
        """``optimizer`` as given, or built from its name (:func:`~treadle.engine.build_optimizer`)."""
        if isinstance(optimizer, torch.optim.Optimizer):
            if wrapper_of(s.ddp)[0] == "fsdp" and comm.get_world_size() > 1:
                check_optimizer_holds(optimizer, model)
            return optimizer
        name, options = (optimizer, {}) if isinstance(optimizer, str) else (optimizer[0], dict(optimizer[1]))
        for key in ("lr", "weight_decay"):
            if key in options and key in self._given_settings:
                raise ValueError(f"{key} is given twice: as {key}={getattr(s, key)!r} and in optimizer's options")
        return build_optimizer(name, model, lr=options.pop("lr", s.lr), no_decay_norm_and_bias=s.no_decay_norm_and_bias,
                               weight_decay=options.pop("weight_decay", s.weight_decay), **options)

    def build_loaders(self, train: Any, evaluation: Any, s: types.SimpleNamespace) -> Any:
        """The training loader and the evaluation one (:mod:`treadle.trainer.data`)."""
        train_loader = as_train_loader(train, s.batch_size, s.total_batch_size, num_workers=s.num_workers,
                                       seed=s.seed, shuffle=s.shuffle, collate_fn=s.collate_fn)
        return train_loader, self._eval_loader_of(evaluation)

    def _eval_loader_of(self, data: Any) -> Any:
        """``data`` as evaluation reads it: a dataset batched by
        ``eval_batch_size``, else the training batch per process."""
        s = self.settings
        check_batch_sizes(None, data, s.batch_size, s.total_batch_size, s.eval_batch_size)
        per_process = s.total_batch_size // comm.get_world_size() if s.total_batch_size else None
        return as_eval_loader(data, s.eval_batch_size or s.batch_size or per_process, num_workers=s.num_workers,
                              collate_fn=s.collate_fn)

    def build_step(self, s: types.SimpleNamespace) -> Any:
        """The step object: ``EagerStep``, or ``CompiledStep`` with ``compile``; a
        :class:`~treadle.compat.step.TrainerStep` where a subclass
        overrides a seed's point of the update."""
        if self._seed_update():
            return TrainerStep(
                self.model, self.train_loader, self.optimizer, owner=weakref.proxy(self), events=self._events,
                overridden=frozenset(name for name in UPDATE_POINTS if self._overrides(name)),
                loss_fn=s.loss_fn, grad_accum_steps=s.grad_accum_steps, clip_grad_norm=s.clip_grad_norm,
                clip_grad_value=s.clip_grad_value, precision=s.precision,
            )
        return build_step(
            "compiled" if s.compile else "eager", self.model, self.train_loader, self.optimizer,
            compile_options=s.compile if isinstance(s.compile, dict) else None, loss_fn=s.loss_fn,
            grad_accum_steps=s.grad_accum_steps, clip_grad_norm=s.clip_grad_norm, clip_grad_value=s.clip_grad_value,
            precision=s.precision, compute_loss=self._own_compute_loss(),
        )

    def build_evaluation(self, s: types.SimpleNamespace) -> TrainerEvaluation:
        """How evaluation runs (:mod:`treadle.trainer.evaluation`), and the
        evaluator of ``eval_loader``, built now so that a bad metric fails now."""
        generate = s.evaluate_with_generate
        by_override = (any(self._overrides(name) for name in EVAL_POINTS if name != "eval_step")
                       or self._hezar_compute_loss or self._hf_compute_loss or "eval_step_start" in self._events
                       or "eval_step_end" in self._events)
        evaluation = TrainerEvaluation(
            self.model, metrics=s.metrics, loss_fn=s.loss_fn, compute_loss=self._own_compute_loss(),
            generate=(dict(generate) if isinstance(generate, dict) else {}) if generate else None,
            batch_fn=self._eval_batch if by_override else None,
            step_results=self.eval_step if self._overrides("eval_step") else None,
            prepare=self._prepare_batch if self._overrides("_prepare_batch") else None,
        )
        evaluator = evaluation.build_evaluator() if self.eval_loader is not None else None
        evaluation.check_forward_loss(self.eval_loader, self.device)
        self.evaluator = evaluation.with_loss_for_early_stopping(evaluator, s.best_metric, s.early_stopping_patience)
        return evaluation

    def build_checkpointer(self) -> Checkpointer:
        assert self.checkpoint_dir is not None  # built with an output_dir only
        return Checkpointer(unwrap_model(self.model), self.checkpoint_dir, optimizer=self.optimizer, trainer=self)

    def build_hooks(self, s: types.SimpleNamespace) -> List[HookBase]:
        """The default hooks (:func:`~treadle.engine.default_hooks.default_hooks`) for these settings."""
        watched, mode = self.evaluation.watched(self.evaluator, s.best_metric, s.best_mode, s.early_stopping_patience,
                                                recorded="eval_epoch_end" in self._events)
        # pytorch-accelerated's create_scheduler() builds it where a subclass overrides it.
        given = self.create_scheduler() if self._overrides("create_scheduler") else s.scheduler
        scheduler = resolve_scheduler(given, self.optimizer, self.max_iter, warmup_iters=s.warmup_iters)
        bar = (s.progress_bar if s.progress_bar is not None else _stderr_is_a_terminal()) and comm.is_main_process()
        total_batch = getattr(self.train_loader, "total_batch_size", None)
        # One iteration is one update: grad_accum_steps batches.
        samples_per_iter = total_batch * s.grad_accum_steps if total_batch else None
        return default_hooks(
            optimizer=self.optimizer, scheduler=scheduler, scheduler_interval=s.scheduler_interval,
            scheduler_step=self.scheduler_step if self._overrides("scheduler_step") else None,
            ema_decay=s.ema_decay, evaluate=self._evaluate_in_training if self.eval_loader is not None else None,
            eval_period=s.eval_period if s.eval_period is not None else self.epoch_length or 0,
            checkpointer=self.checkpointer, best_metric=watched if s.best_metric else None, best_mode=mode,
            stop_metric=watched if s.early_stopping_patience else None, stop_patience=s.early_stopping_patience,
            stop_mode=mode, watches_training=watches_training(s.best_metric),
            epochs=self.history.epochs if self.epoch_length else None,
            epoch_callbacks=[fn for fn in s.callbacks if not is_event_callback(fn)],
            checkpoint_period=s.checkpoint_period if s.checkpoint_period is not None else self.epoch_length or 0,
            max_to_keep=s.max_to_keep, handle_preemption=s.preemption and self.checkpointer is not None,
            writers=self.build_writers(samples_per_iter, console=not bar),
            log_period=s.log_period, progress_bar=bar,
            output_dir=self.output_dir, samples_per_iter=samples_per_iter, user_hooks=list(s.hooks),
            before_evaluation=[h for h in (TrainEvents(self._events),) if h.active()],
            after_history=[h for h in (RunEvents(self._events),) if h.active()],
        )

    def build_writers(self, samples_per_iter: Optional[int], *, console: bool) -> List[EventWriter]:
        """What ``loggers`` names, and the console where no progress bar shows the losses
        (:func:`~treadle.events.get_default_writers`, ``DefaultTrainer``'s assembly too)."""
        loggers = self.settings.loggers
        return get_default_writers(
            self.logs_dir, self.max_iter, samples_per_iter=samples_per_iter, console=console,
            files=[n for n in loggers if n in FILE_LOGGERS],
            trackers={n: {"dir": self.logs_dir} if n == "wandb" else {} for n in loggers if n in ("mlflow", "wandb")},
            writers=[w for w in loggers if isinstance(w, EventWriter)],
        )

    def _own_compute_loss(self) -> Optional[Callable[[Any], Any]]:
        """A subclass's :meth:`compute_loss` (treadle's, of a batch; the Hugging Face Trainer's through
        :meth:`batch_loss`): the loss of training and evaluation alike."""
        if not self._own_compute_loss_override:
            return None
        return self.batch_loss if self._hf_compute_loss else self.compute_loss

    # ------------------------------------------------------------------ the seeds' override points
    def _overrides(self, name: str) -> bool:
        return overridden(self, name, Trainer)

    def _seed_update(self) -> bool:
        """Whether training calls a subclass's seed method (the step is then a ``TrainerStep``)."""
        return (any(self._overrides(name) for name in UPDATE_POINTS) or self._hezar_compute_loss
                or "train_step_start" in self._events or "train_step_end" in self._events)

    def _check_overrides(self, s: types.SimpleNamespace) -> SeedEventCalls:
        """Refuses, in one line, a seed method this subclass defines that treadle
        never calls, or one that would leave a setting unused
        (:mod:`treadle.compat.names`); returns who is called at each event."""
        refuse_seed_methods(self, Trainer)
        cls = type(self).__name__
        loss_seed = compute_loss_seed(self, Trainer)
        self._hezar_compute_loss, self._hf_compute_loss = loss_seed == HEZAR, loss_seed == HUGGING_FACE
        self._own_compute_loss_override = loss_seed in ("treadle", HUGGING_FACE)
        self._loss_by_parts = any(self._overrides(n) for n in ("_prepare_batch", "_forward_pass", "_compute_loss"))
        callbacks = [(c, "callbacks") for c in s.callbacks if is_event_callback(c)]
        events = SeedEventCalls(self, Trainer, callbacks + [(h, "hooks") for h in s.hooks])
        self._events = events
        if self._overrides("train_step"):
            defaults = {"grad_accum_steps": 1, "clip_grad_norm": None, "clip_grad_value": None, "precision": "fp32",
                        "compile": False}
            for name, default in defaults.items():
                if getattr(s, name) != default:
                    raise ValueError(
                        f"{cls}.train_step does the whole update itself (qurious' contract), so {name}="
                        f"{getattr(s, name)!r} would never act: apply it in train_step, or override "
                        "compute_loss(self, batch) and keep treadle's update")
            for hook in s.hooks:
                if hook.overrides("after_backward"):
                    raise ValueError(f"{cls}.train_step does the whole update itself, so {type(hook).__name__}."
                                     "after_backward would never run: call it from train_step, or override "
                                     "compute_loss(self, batch) and keep treadle's update")
        if s.compile and self._seed_update():
            raise ValueError(f"compile={s.compile!r} compiles treadle's loss (compute_loss), and {cls} overrides a "
                             "seed's point of the update, which would run uncompiled: leave compile out, or "
                             "override compute_loss(self, batch) alone")
        if self._overrides("eval_step") and "metrics" in self._given_settings:
            raise ValueError(f"{cls}.eval_step computes the evaluation's results (qurious' contract), so metrics="
                             f"{list(s.metrics)!r} would never be computed: return them from eval_step, or give "
                             "metrics without eval_step")
        if self._overrides("create_scheduler") and s.scheduler is not None:
            raise ValueError(f"{cls}.create_scheduler builds the schedule, and scheduler={s.scheduler!r} is given "
                             "too: give one of them")
        if self._overrides("scheduler_step") and s.scheduler is None and not self._overrides("create_scheduler"):
            raise ValueError(f"{cls}.scheduler_step steps the schedule, and there is none: give scheduler= (or "
                             "override create_scheduler)")
        return events

    def _eval_batch(self, batch: Any) -> Any:
        """One evaluation batch through a subclass's seed methods: its outputs
        (what metrics score) and its loss."""
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

    def _set_step(self, step: StepBase) -> None:
        if isinstance(step, StepBase):
            refuse_libai_run_step(step)
        TrainerBase.step.fset(self, step)  # type: ignore[attr-defined]

    # Read by the loop every iteration: the getter is TrainerBase's own, not a call added to it.
    step = property(TrainerBase.step.fget, _set_step,  # type: ignore[attr-defined,assignment]
                    doc="""The step object (``TrainerBase.step``); one whose ``run_step`` takes
        LiBai's ``get_batch`` is refused with the way to write it.""")

    @property
    def scheduler(self) -> Any:
        """The schedule the learning-rate hook steps (pytorch-accelerated's
        ``trainer.scheduler``), or None; an fvcore schedule's ``LRMultiplier`` exists once training started."""
        return next((getattr(h, "scheduler", None) for h in self.hooks if isinstance(h, LRScheduler)), None)

    # ------------------------------------------------------------------ running
    def train(self, resume: Resume = False, *, move_aside: bool = False) -> TrainingHistory:  # type: ignore[override]
        """Trains to ``max_iter`` and returns the :class:`TrainingHistory`.

        ``resume=True`` continues exactly from the last checkpoint of
        ``output_dir``, ``resume=path`` from that checkpoint (Hezar's
        ``resume_from_checkpoint``); the settings given to this ``Trainer``
        are kept over the checkpoint's (a warning names each). After
        :meth:`train_epoch`, ``train()`` trains the rest of the run; a second
        ``train()`` is refused in one line (it would start over on the trained weights).

        The ``output_dir`` is claimed first (:mod:`treadle.engine.session`):
        another job there, or a fresh start over an earlier run, is a
        :class:`~treadle.utils.run_folder.RunFolderError`, unless
        ``move_aside=True`` renames the earlier run's folder. Nothing is deleted.
        """
        if not isinstance(resume, (bool, str, os.PathLike)):
            raise TypeError(f"resume must be True, False or a checkpoint path, got {resume!r}")
        if resume is True and self.checkpointer is None:
            raise ValueError("resume=True needs an output_dir with checkpoints; or give resume='path/to/checkpoint.pth'")
        if self._paused and resume is False:
            return self._run(False, continuing=True)
        if self._trained and resume is False:
            if self.last_run_iter + 1 >= self.max_iter and self._by_epochs:
                raise RuntimeError(
                    f"train_epoch() has trained every epoch of the run (to iteration {self.last_run_iter}, "
                    f"max_iter={self.max_iter}): there is nothing left for train(); raise max_epochs in a new "
                    "Trainer to train further")
            raise RuntimeError(
                f"this Trainer has trained already (to iteration {self.last_run_iter}): a second train() would "
                "start the run over on the trained weights. Continue a stopped run with train(resume=True), or "
                "build a new Trainer"
            )
        return self._run(resume, move_aside=move_aside)

    def train_epoch(self) -> Dict[str, float]:
        """Trains the next epoch and returns its row of the history (qurious'
        ``train_epoch``): ``train_loss`` and the other training means, and the
        evaluation results of the epoch's end when there is an ``eval_loader``.

        ``n`` calls give the rows and weights of one ``train()`` of ``n`` epochs;
        ``train()`` after them trains the rest. Between calls the run is paused
        as a preempted one is; the call of the last epoch ends it as ``train()`` does.
        """
        if not self.epoch_length:
            raise ValueError("train_epoch() needs data with a length (the epoch length is not known)")
        start = self.last_run_iter + 1
        if start < self.max_iter and self._trained and not self._paused and self.stop_reason is not None:
            raise RuntimeError(
                f"train_epoch(): the run was stopped at epoch {self.last_run_iter // self.epoch_length} (iteration "
                f"{self.last_run_iter} of max_iter={self.max_iter}) by {self.stop_reason}; build a new Trainer to train more"
            )
        if start >= self.max_iter or (self._trained and not self._paused):
            raise RuntimeError(f"train_epoch(): every iteration of the run (max_iter={self.max_iter}) has been trained")
        self._pause_after_epoch = start // self.epoch_length
        self._by_epochs = True
        try:
            self._run(False, continuing=start > 0)
        finally:
            self._pause_after_epoch = None
        return dict(self.history.epochs[-1])

    def after_epoch(self) -> None:
        super().after_epoch()
        # train_epoch(): pause after its epoch, unless that is the run's last
        # (then training ends as train() ends it).
        epoch, length = self.epoch, self.epoch_length
        assert epoch is not None and length is not None  # after_epoch runs only where epochs are known
        if self._pause_after_epoch == epoch and (epoch + 1) * length < self.max_iter:
            self.request_stop(f"train_epoch(): epoch {self.epoch} done", interrupted=True)

    def _run(self, resume: Resume, *, move_aside: bool = False, continuing: bool = False) -> TrainingHistory:
        """``train()``'s body; ``continuing``: go on from where this process's
        last training stopped (``train_epoch()``), with its recent values."""
        refuse_methods_set_on_instance(self)
        self._in_training = True
        try:
            return self._run_in_session(resume, move_aside=move_aside, continuing=continuing)
        finally:
            self._in_training = False

    def _run_in_session(self, resume: Resume, *, move_aside: bool, continuing: bool) -> TrainingHistory:
        if continuing:
            self.session.claim(resume=True)
            start_iter = self.last_run_iter + 1
            self._restored_storage = self.storage.recent_state()
        else:
            start_iter = self.session.open(self, resume=resume, move_aside=move_aside)
        self._trained = True
        with self.session.running(self.has_work(start_iter, self.max_iter)):
            super().train(start_iter, self.max_iter)
        self._paused = self._pause_after_epoch is not None and self.interrupted
        if hasattr(self, "storage"):
            self.history.iterations = iteration_history(self.storage)
        return self.history

    def _after_failed_training(self, error: BaseException) -> None:
        # The user's method an error was raised in is what the report names (hooks are named by the hook
        # table); not a Ctrl-C's or an exit's, which a signal raises wherever the loop happens to be.
        where = raised_in(error, self, Trainer) if isinstance(error, Exception) else None
        if where is not None:
            note_origin(error, f"{where} at iteration {self.iter}")
        super()._after_failed_training(error)

    def evaluate(self, loader: Optional[Iterable[Any]] = None) -> Dict[str, Any]:
        """Evaluates the model on ``loader`` (batches, or a dataset batched as
        ``eval_loader`` is; default: ``eval_loader``) with ``metrics``; without
        metrics, its ``loss`` (computed as in training)."""
        if loader is None and self.eval_loader is None:
            raise ValueError("Trainer.evaluate needs a loader: pass one or give eval_loader to the Trainer")
        loader = self._eval_loader_of(loader) if loader is not None and loader is not self.eval_loader else self.eval_loader
        evaluator = self.evaluator if self.evaluator is not None else self.evaluation.build_evaluator()
        outside = not self._in_training
        if outside:
            self._events.fire("evaluation_run_start")
        self._events.fire("eval_epoch_start")
        results = self.evaluation.evaluate(loader, evaluator, self.device)
        if "loss" in results:
            self.run_history.record("eval_loss_epoch", float(results["loss"]))
        self._events.fire("eval_epoch_end")
        if outside:
            self._events.fire("evaluation_run_end")
        return results

    def _evaluate_in_training(self) -> Dict[str, Any]:
        """An evaluation of training: :meth:`evaluate` (a subclass's
        ``evaluate(dataloader)`` too) on ``eval_loader``, every module's
        training mode restored after it."""
        with inference_context(self.model):
            return self.evaluate(self.eval_loader)

    # ------------------------------------------------------------------ one batch
    def compute_loss(self, batch: Any) -> Any:
        """The loss of one batch (on the device). Override it for a custom loss
        (pytorch-accelerated's ``calculate_train_batch_loss``): a scalar, a dict
        of scalars or an object with ``.loss``. It is the loss everywhere:
        training, :meth:`train_step`, :meth:`eval_step`, :meth:`evaluate`;
        ``self.model.training`` is False in evaluation (the model is in eval
        mode), so a value logged for training only goes under
        ``if self.model.training:`` (Lightning's ``self.log`` in ``training_step``).
        Where a subclass overrides qurious' ``_prepare_batch``, ``_forward_pass``
        or ``_compute_loss``, it is theirs, in that order."""
        if self._loss_by_parts:
            return self._batch_loss_by_parts(batch)
        return EagerStep.compute_loss(self._own_step(), batch)

    def train_step(self, batch: Any) -> Dict[str, float]:
        """One optimizer update on ``batch``, outside :meth:`train` (a notebook's
        loop): returns the losses as floats, ``loss`` being their total. No
        hook runs (the schedule does not advance)."""
        losses = self._own_step().train_on_batch(batch)
        out = {"loss": float(losses.pop("total_loss"))}
        out.update({name: float(value) for name, value in losses.items()})
        return out

    def _own_step(self) -> EagerStep:
        """The step this Trainer built (``compute_loss`` and ``train_step`` are its)."""
        step = self.step
        if not isinstance(step, EagerStep):
            raise TypeError(f"compute_loss() and train_step() are the Trainer's own step's; this trainer's step is a "
                            f"{type(step).__name__}")
        return step

    def eval_step(self, batch: Any) -> Dict[str, float]:
        """The loss and ``metrics`` of one batch, in eval mode: floats, by
        name. The loss is computed as in training (:meth:`compute_loss`);
        with ``evaluate_with_generate``, only where ``metrics`` ask for it."""
        return self.evaluation.one_batch(batch, self.evaluator, self.device)

    # ------------------------------------------------------------------ checkpoints by path
    def _checkpoint_io(self) -> Checkpointer:
        return self.checkpointer or Checkpointer(unwrap_model(self.model), "", optimizer=self.optimizer, trainer=self)

    def save_checkpoint(self, path: str, **extra: Any) -> Optional[str]:
        """Writes a full checkpoint (model, optimizer, schedule, hooks, random
        states, data position) to ``path``, atomically, with ``extra`` values;
        ``output_dir`` is not needed. Returns the path."""
        _check_path("save_checkpoint", path)
        return self.session.checkpointer.save_file(os.fspath(path), iteration=self.last_run_iter, **extra)

    def load_checkpoint(self, path: str, load_optimizer: bool = True, load_scheduler: bool = True) -> Dict[str, Any]:
        """Loads the model's weights from ``path`` (qurious' and
        pytorch-accelerated's ``load_checkpoint``), and the optimizer's and
        the schedule's states unless told not to; training then starts at
        iteration 0 (``train(resume=path)`` continues the checkpoint's run).
        Returns what else the file holds (``iteration``...)."""
        _check_path("load_checkpoint", path)
        return self.session.load_file(self, path, optimizer=load_optimizer, scheduler=load_scheduler)


# ---------------------------------------------------------------------- helpers
def _check_epoch_events(events: SeedEventCalls, epoch_length: Optional[int]) -> None:
    for event in TRAIN_EPOCH_EVENTS:
        if event in events and not epoch_length:
            raise ValueError(f"{event} is called at each epoch's end (pytorch-accelerated's event), and this "
                             "train_loader has no length (no epochs): give data with a length, or use a hook's "
                             "after_step with a period")


def _check_path(method: str, path: Any) -> None:
    # Before any file is touched: bytes would reach os.path and torch as Python's own TypeErrors.
    path_rule(empty=False)(f"{method}'s path", path)


def _logs_dir(values: Dict[str, Any]) -> Optional[str]:
    """Where log.txt goes, from settings not checked yet (a bad one: nowhere; the check then says why)."""
    output_dir, sub = values["output_dir"], values["logs_dir"]
    if not isinstance(output_dir, (str, os.PathLike)) or not isinstance(sub, (str, os.PathLike, type(None))):
        return None
    return _inside(os.fspath(output_dir), os.fspath(sub) if sub else None)


def _inside(output_dir: Optional[str], sub: Optional[str]) -> Optional[str]:
    if output_dir is None:
        return None
    return os.path.join(output_dir, sub) if sub else output_dir


def _stderr_is_a_terminal() -> bool:
    # What ProgressBar(disable=None) decides, decided here because the
    # console printer is written only where no bar shows the losses.
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


