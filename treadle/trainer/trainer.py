"""The plain-object trainer: treadle's loop without configs.

For users of Hezar's ``Trainer``, pytorch-accelerated or a small
``Trainer(model, optimizer, loss_fn)`` class: the same engine, hooks, writers,
checkpoints and run session as :class:`~treadle.engine.DefaultTrainer`, from
objects. Its settings, their defaults and what each needs are one table,
:mod:`treadle.trainer.settings`; its data, :mod:`treadle.trainer.data`;
its evaluation, :mod:`treadle.trainer.evaluation`; its hooks and writers,
:mod:`treadle.trainer.assembly`; what a subclass's methods of other trainers' names change,
:mod:`treadle.trainer.subclass`; its process, :mod:`treadle.trainer.process`;
its run in its folder, :mod:`treadle.trainer.run` and :mod:`treadle.engine.session`.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Callable, Collection, Dict, Iterable, List, NoReturn, Optional, Union

import torch
from torch import nn
from typing_extensions import Unpack

from treadle.checkpoint import CheckpointError, Checkpointer, unwrap_model
from treadle.checkpoint import init_weights_from as load_matching_weights
from treadle.config.rules import path as path_rule
from treadle.events import EventWriter
from treadle.evaluation.inference import inference_context
from treadle.hooks import HookBase, LRScheduler
from treadle.utils import comm
from treadle.utils.device import resolve_device
from treadle.utils.env import seed_all_rng
from treadle.utils.run_folder import RunFolder

from treadle.solver import build_optimizer

from treadle.engine.build import build_step, loader_epoch_length
from treadle.engine.hook_table import note_origin
from treadle.compat.names import CALLBACK_EVENTS, SEED_METHODS, overridden, refuse_libai_run_step
from treadle.compat.overrides import EVAL_POINTS, UPDATE_POINTS, raised_in
from treadle.compat.step import TrainerStep
from treadle.engine.history import RunHistory, TrainingHistory
from treadle.engine.data_parallel import check_optimizer_holds, wrap_model
from treadle.engine.session import Resume, RunSession
from treadle.engine.steps import EagerStep, StepBase
from treadle.engine.train_loop import TrainerBase
from .assembly import trainer_hooks, trainer_writers
from .data import as_eval_loader, as_train_loader, check_batch_sizes, run_length, warn_about_leftover_batches
from .evaluation import TrainerEvaluation
from .process import inside, join_processes, start_console
from .run import TrainerRun
from .settings import (
    LOGGERS, TrainerSettings, TrainerSettingsDict, checked_settings, given_settings, replaced_settings, wrapper_of,
)
from .settings_docs import document_settings
from .subclass import SeedSubclass, check_epoch_events

__all__ = ["Trainer", "TrainingHistory", "LOGGERS", "SEED_METHODS"]

logger = logging.getLogger(__name__)

# Per-iteration history is kept in memory for the returned history; beyond
# this many iterations the oldest values are dropped (global averages stay).
_MAX_HISTORY = 1_000_000

_NOT_COPIED = ("A Trainer cannot be {how}: its hooks, step and checkpointer hold the Trainer they were built for, "
               "so a copy would not train; build another Trainer from the same arguments, and save or load its "
               "state with save_checkpoint(path) and load_checkpoint(path)")

class Trainer(SeedSubclass, TrainerRun):
    """Trainer(model, optimizer, train_loader, **settings)

    Trains ``model`` from plain objects and returns its history.

    Example::

        trainer = Trainer(model, "adamw", train_dataset, batch_size=64, lr=1e-3,
                          loss_fn=F.cross_entropy, eval_loader=val_dataset,
                          metrics=["accuracy", "f1"], max_epochs=5, output_dir="out",
                          best_metric="accuracy", early_stopping_patience=3)
        history = trainer.train()
        print(history.epochs[-1]["accuracy"])

    The settings are keyword arguments, listed below by purpose (data,
    optimization, evaluation, checkpoints, logging, processes), typed for
    mypy and editors by :class:`~treadle.trainer.settings.TrainerSettingsDict`, and kept,
    checked, as :attr:`settings` (a :class:`~treadle.trainer.settings.TrainerSettings`).
    Every setting acts, or is refused (a ``ValueError``) or warned about in
    one line when the ``Trainer`` is built, before anything is written: the
    table of :mod:`treadle.trainer.settings`, shown in
    ``docs/trainer.md``; ``docs/migrating.md`` maps the names of the trainers you may come from
    to these. A subclass overrides the methods those trainers document (qurious'
    ``train_step``, pytorch-accelerated's ``calculate_train_batch_loss``,
    Hezar's ``training_step``...): each is called at that trainer's moment, or
    refused when the subclass is built (the table of
    :mod:`treadle.compat.names`; the defaults are :class:`~treadle.compat.overrides.SeedOverrides`'s).
    Under ``torchrun`` (or :func:`~treadle.engine.launch`) the same script
    trains one model on every process (``docs/distributed.md``).

    Args:
        model: the module to train; moved to ``device``.
        optimizer: a torch optimizer, or ``"sgd"``/``"adam"``/``"adamw"``: torch's class with
            torch's defaults (no momentum for sgd), or ``("sgd", {"momentum": 0.9})``.
        train_loader: batches (a ``DataLoader``, a generator: an iterable that is not a list), or a
            dataset (a torch ``Dataset``, a list of samples) batched by ``batch_size``.
    """

    # The settings typed by name (TrainerSettingsDict) for mypy and editors, and still **settings: which
    # were given (passed, not None) is what the checks read, and a parameter with a default would hide it.
    def __init__(self, model: nn.Module, optimizer: Union[torch.optim.Optimizer, str, tuple], train_loader: Any,
                 **settings: Unpack[TrainerSettingsDict]) -> None:
        values, self._given_settings = given_settings(settings)
        self._build(model, optimizer, train_loader, values)

    def _build(self, model: nn.Module, optimizer: Any, train_loader: Any, values: Dict[str, Any]) -> None:
        """The constructor's jobs, in order: check every setting, then build."""
        start_console(values)
        s = self._settings = checked_settings(model, optimizer, train_loader, values, self._given_settings)
        join_processes(s.processes)
        opt, output_dir = s.optimization, s.checkpoints.output_dir
        self.output_dir = output_dir
        self.checkpoint_dir = inside(output_dir, s.checkpoints.checkpoints_dir)
        self.logs_dir = inside(output_dir, s.logging.logs_dir)
        events = self._check_overrides(Trainer, s)
        if s.processes.seed is not None:
            seed_all_rng(s.processes.seed)
        self.device = resolve_device(s.processes.device)
        self.model = self.build_model(model, s)
        self.optimizer = self.build_optimizer(optimizer, unwrap_model(self.model), s)
        self.loss_fn = opt.loss_fn
        self.train_loader, self.eval_loader = self.build_loaders(train_loader, s.evaluation.eval_loader, s)
        epoch_length = loader_epoch_length(self.train_loader, opt.grad_accum_steps)
        check_epoch_events(events, epoch_length)
        max_iter = run_length(opt.max_iter, opt.max_epochs, epoch_length)
        if opt.max_epochs is not None:
            warn_about_leftover_batches(self.train_loader, opt.grad_accum_steps, epoch_length)
        super().__init__(self.build_step(s), history_length=min(max(max_iter, 10_000), _MAX_HISTORY))
        self.max_iter, self.epoch_length = max_iter, epoch_length
        self.history = TrainingHistory()
        self.run_history = RunHistory(self.history)
        self.evaluation = self.build_evaluation(s)
        #: What evaluation computes (the list given as ``metrics``); a subclass may
        #: use the name for its own (pytorch-accelerated's ``TrainerWithMetrics``).
        self.metrics: Any = self.evaluation.metrics
        self.checkpointer = self.build_checkpointer() if output_dir is not None else None
        self.session = RunSession(
            output_dir, self._checkpoint_io(), folder_names=RunFolder.TRAINER_API,
            subdirs=[d for d in (s.checkpoints.checkpoints_dir, s.logging.logs_dir) if d],
        )
        self.register_hooks(self.build_hooks(s))
        events.fire("init_end")

    @property
    def settings(self) -> TrainerSettings:
        """The settings, checked, by purpose (``settings.evaluation.eval_period``);
        read-only: the ``Trainer``'s parts are built from them."""
        return self._settings

    @settings.setter
    def settings(self, value: Any) -> None:
        raise AttributeError(replaced_settings(self._settings, value))

    def hook_methods_called(self, hook: HookBase) -> Collection[str]:
        """The callback events (pytorch-accelerated's ``on_*``, of
        :data:`~treadle.compat.names.CALLBACK_EVENTS`) of a hook given as
        ``hooks=``, which the ``Trainer`` calls at those events; none of a hook
        registered otherwise."""
        return CALLBACK_EVENTS if any(hook is given for given in self._settings.logging.hooks) else ()

    # A copy would share the model, optimizer and data with this Trainer, and its hooks and
    # step would still point at this one: refused, with what to do instead.
    def __copy__(self) -> NoReturn:
        raise TypeError(_NOT_COPIED.format(how="copied (copy.copy)"))

    def __deepcopy__(self, memo: Dict[int, Any]) -> NoReturn:
        raise TypeError(_NOT_COPIED.format(how="copied (copy.deepcopy)"))

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError(_NOT_COPIED.format(how="pickled"))

    # ------------------------------------------------------------------ builders
    def build_model(self, model: nn.Module, s: TrainerSettings) -> nn.Module:
        """``model`` on the device, with ``init_weights_from``'s weights, wrapped on several processes."""
        model.to(self.device)
        init_weights_from = s.checkpoints.init_weights_from
        if init_weights_from:
            try:
                load_matching_weights(model, init_weights_from)
            except CheckpointError as e:  # the checkpoint's words name the file; the setting is said too
                raise type(e)(f"init_weights_from={init_weights_from!r}: {e}") from None
        kind, options = wrapper_of(s.processes.ddp)
        return wrap_model(model, kind, setting="ddp", **options)

    def build_optimizer(self, optimizer: Any, model: nn.Module, s: TrainerSettings) -> torch.optim.Optimizer:
        """``optimizer`` as given, or built from its name (:func:`~treadle.engine.build_optimizer`)."""
        if isinstance(optimizer, torch.optim.Optimizer):
            if wrapper_of(s.processes.ddp)[0] == "fsdp" and comm.get_world_size() > 1:
                check_optimizer_holds(optimizer, model)
            return optimizer
        opt = s.optimization
        name, options = (optimizer, {}) if isinstance(optimizer, str) else (optimizer[0], dict(optimizer[1]))
        for key in ("lr", "weight_decay"):
            if key in options and key in self._given_settings:
                raise ValueError(f"{key} is given twice: as {key}={getattr(opt, key)!r} and in optimizer's options")
        return build_optimizer(name, model, lr=options.pop("lr", opt.lr),
                               no_decay_norm_and_bias=opt.no_decay_norm_and_bias,
                               weight_decay=options.pop("weight_decay", opt.weight_decay), **options)

    def build_loaders(self, train: Any, evaluation: Any, s: TrainerSettings) -> Any:
        """The training loader and the evaluation one (:mod:`treadle.trainer.data`)."""
        data = s.data
        train_loader = as_train_loader(train, data.batch_size, data.total_batch_size, num_workers=data.num_workers,
                                       seed=s.processes.seed, shuffle=data.shuffle, collate_fn=data.collate_fn)
        return train_loader, self._eval_loader_of(evaluation)

    def _eval_loader_of(self, data: Any) -> Any:
        """``data`` as evaluation reads it: a dataset batched by
        ``eval_batch_size``, else the training batch per process."""
        d = self.settings.data
        check_batch_sizes(None, data, d.batch_size, d.total_batch_size, d.eval_batch_size)
        per_process = d.total_batch_size // comm.get_world_size() if d.total_batch_size else None
        return as_eval_loader(data, d.eval_batch_size or d.batch_size or per_process, num_workers=d.num_workers,
                              collate_fn=d.collate_fn)

    def build_step(self, s: TrainerSettings) -> Any:
        """The step object: ``EagerStep``, or ``CompiledStep`` with ``compile``; a
        :class:`~treadle.compat.step.TrainerStep` where a subclass
        overrides a point of another trainer's update (pytorch-accelerated's
        ``backward_step``, Hezar's ``training_step``...)."""
        opt = s.optimization
        if self._seed_update():
            return TrainerStep(
                self.model, self.train_loader, self.optimizer, owner=weakref.proxy(self), events=self._events,
                overridden=frozenset(name for name in UPDATE_POINTS if self._overrides(name)),
                loss_fn=opt.loss_fn, grad_accum_steps=opt.grad_accum_steps, clip_grad_norm=opt.clip_grad_norm,
                clip_grad_value=opt.clip_grad_value, precision=opt.precision,
            )
        return build_step(
            "compiled" if opt.compile else "eager", self.model, self.train_loader, self.optimizer,
            compile_options=opt.compile if isinstance(opt.compile, dict) else None, loss_fn=opt.loss_fn,
            grad_accum_steps=opt.grad_accum_steps, clip_grad_norm=opt.clip_grad_norm,
            clip_grad_value=opt.clip_grad_value, precision=opt.precision, compute_loss=self._own_compute_loss(),
        )

    def build_evaluation(self, s: TrainerSettings) -> TrainerEvaluation:
        """How evaluation runs (:mod:`treadle.trainer.evaluation`), and the
        evaluator of ``eval_loader``, built now so that a bad metric fails now."""
        ev = s.evaluation
        generate = ev.evaluate_with_generate
        by_override = (any(self._overrides(name) for name in EVAL_POINTS if name != "eval_step")
                       or self._hezar_compute_loss or self._hf_compute_loss or "eval_step_start" in self._events
                       or "eval_step_end" in self._events)
        evaluation = TrainerEvaluation(
            self.model, metrics=ev.metrics, loss_fn=s.optimization.loss_fn, compute_loss=self._own_compute_loss(),
            generate=(dict(generate) if isinstance(generate, dict) else {}) if generate else None,
            batch_fn=self._eval_batch if by_override else None,
            step_results=self.eval_step if self._overrides("eval_step") else None,
            prepare=self._prepare_batch if self._overrides("_prepare_batch") else None,
        )
        evaluator = evaluation.build_evaluator() if self.eval_loader is not None else None
        evaluation.check_forward_loss(self.eval_loader, self.device)
        self.evaluator = evaluation.with_loss_for_early_stopping(evaluator, ev.best_metric, ev.early_stopping_patience)
        return evaluation

    def build_checkpointer(self) -> Checkpointer:
        assert self.checkpoint_dir is not None  # built with an output_dir only
        return Checkpointer(unwrap_model(self.model), self.checkpoint_dir, optimizer=self.optimizer, trainer=self)

    def build_hooks(self, s: TrainerSettings) -> List[HookBase]:
        """The default hooks (:func:`~treadle.engine.default_hooks.default_hooks`) for these settings
        (:func:`~treadle.trainer.assembly.trainer_hooks`)."""
        # pytorch-accelerated's create_scheduler() builds it where a subclass overrides it.
        scheduler = self.create_scheduler() if self._overrides("create_scheduler") else s.optimization.scheduler
        return trainer_hooks(self, s, scheduler, self._events,
                             scheduler_step=self.scheduler_step if self._overrides("scheduler_step") else None,
                             evaluate=self._evaluate_in_training if self.eval_loader is not None else None)

    def build_writers(self, samples_per_iter: Optional[int], *, console: bool) -> List[EventWriter]:
        """What ``loggers`` names, and the console where no progress bar shows the losses
        (:func:`~treadle.trainer.assembly.trainer_writers`)."""
        return trainer_writers(self, samples_per_iter, console=console)

    def _own_compute_loss(self) -> Optional[Callable[[Any], Any]]:
        """A subclass's :meth:`compute_loss` (treadle's, of a batch; the Hugging Face Trainer's through
        :meth:`batch_loss`): the loss of training and evaluation alike."""
        if not self._own_compute_loss_override:
            return None
        return self.batch_loss if self._hf_compute_loss else self.compute_loss

    # ------------------------------------------------------------------ other trainers' override points
    def _overrides(self, name: str) -> bool:
        return overridden(self, name, Trainer)

    def _seed_update(self) -> bool:
        """Whether training calls a subclass's method of another trainer's update (the step is then a ``TrainerStep``)."""
        return (any(self._overrides(name) for name in UPDATE_POINTS) or self._hezar_compute_loss
                or "train_step_start" in self._events or "train_step_end" in self._events)

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
            self._refuse_second_train()
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

    def _after_failed_training(self, error: BaseException) -> None:
        # The user's method an error was raised in is what the report names (hooks are named by the hook
        # table); not a Ctrl-C's or an exit's, which a signal raises wherever the loop happens to be.
        where = raised_in(error, self, Trainer) if isinstance(error, Exception) else None
        if where is not None:
            note_origin(error, where, self.iter)
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
def _check_path(method: str, path: Any) -> None:
    # Before any file is touched: bytes would reach os.path and torch as Python's own TypeErrors.
    path_rule(empty=False)(f"{method}'s path", path)


document_settings(Trainer)
