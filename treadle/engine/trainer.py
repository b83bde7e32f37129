"""The plain-object trainer: treadle's loop without configs.

For users of Hezar's ``Trainer``, pytorch-accelerated or a small
``Trainer(model, optimizer, loss_fn)`` class: the same engine, hooks, writers
and checkpoints as :class:`~treadle.engine.DefaultTrainer`, from objects.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

import torch
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn

from treadle.checkpoint import Checkpointer, unwrap_model
from treadle.config.rules import is_number
from treadle.checkpoint import init_weights_from as load_matching_weights
from treadle.data import InferenceSampler, TrainLoader, build_test_loader, build_train_loader
from treadle.evaluation import (
    build_evaluator,
    default_forward,
    forward_for,
    inference_on_dataset,
    known_metric_mode,
    metric_mode,
)
from treadle.evaluation.batch import move_to_device
from treadle.evaluation.inference import inference_context
from treadle.evaluation.loss import LossEvaluator
from treadle.events import CommonMetricPrinter, CSVWriter, EventWriter, JSONWriter, MLflowWriter, TensorboardWriter, WandbWriter
from treadle.hooks import HookBase, LRScheduler
from treadle.utils import comm
from treadle.utils.device import resolve_device
from treadle.utils.env import seed_all_rng
from treadle.utils.logger import setup_logger, start_log_files
from treadle.utils.run_folder import RunFolder, check_output_dir, claim_on_main_process

from .build import build_optimizer, build_step, loader_batches, loader_epoch_length, resolve_scheduler
from .default_hooks import default_hooks
from .history import EpochCallback, TrainingHistory
from .launch import DEFAULT_TIMEOUT, join_env_process_group, leave_process_group, wrap_model
from .resume import restore_hyperparameters, take_hyperparameters
from .train_loop import TrainerBase

__all__ = ["Trainer", "TrainingHistory", "LOGGERS"]

logger = logging.getLogger(__name__)

# Per-iteration history is kept in memory for the returned history; beyond
# this many iterations the oldest values are dropped (global averages stay).
_MAX_HISTORY = 1_000_000

#: What ``loggers=`` may name: files written into the logs folder, and the
#: trackers (optional extras; with their defaults: MLflow's default store,
#: W&B online; give a writer object to choose).
LOGGERS = ("json", "tensorboard", "csv", "mlflow", "wandb")

# Prefixes other trainers put on the metric to watch (Hezar's
# "evaluation.f1", HF's "eval_loss", Lightning's "val/..."): the name in
# treadle's storage is what follows. "train" ones name a training scalar.
_EVAL_PREFIXES = ("eval/", "evaluation/", "eval.", "evaluation.", "eval_")
_TRAIN_PREFIXES = ("train/", "train.", "train_")


class Trainer(TrainerBase):
    """Trains ``model`` from plain objects and returns its history.

    Example::

        trainer = Trainer(model, "adamw", train_dataset, batch_size=64, lr=1e-3,
                          loss_fn=F.cross_entropy, eval_loader=val_dataset,
                          metrics=["accuracy", "f1"], max_epochs=5, output_dir="out",
                          best_metric="accuracy", early_stopping_patience=3)
        history = trainer.train()
        print(history.epochs[-1]["accuracy"])

    Or one epoch at a time (qurious' ``train_epoch``): ``row =
    trainer.train_epoch()`` trains the next epoch and returns its row
    (:meth:`train_epoch`).

    ``docs/migrating.md`` maps the arguments of Hezar's, pytorch-accelerated's
    and qurious' trainers, and of the Hugging Face Trainer, to these.

    On several processes (``torchrun --nproc-per-node N script.py``, or
    :func:`~treadle.engine.launch` calling a function that builds the
    Trainer), the same script trains one model: the processes join
    torchrun's process group, the model is wrapped (``ddp``), a dataset is
    sharded with a sampler whose position resumes exactly (a torch
    ``DataLoader`` over a dataset is re-batched so, as Lightning does; other
    iterables are read whole by every process, with a warning), evaluation
    is sharded and its metrics reduced over the processes, and files,
    console and trackers are written by the main process only.

    Args:
        model: the module to train; moved to ``device``.
        optimizer: an optimizer, or ``"sgd"``/``"adam"``/``"adamw"`` with
            ``lr`` and ``weight_decay`` (norms and biases get no decay).
        train_loader: an iterable of batches (a ``DataLoader``, a treadle
            ``TrainLoader``, a generator), or a map-style dataset with
            ``batch_size`` (and ``shuffle``, ``collate_fn``, ``num_workers``),
            for which a resumable loader is built.
        loss_fn: ``loss_fn(model(inputs), targets)`` on ``(inputs, targets)``
            batches. Without it the model computes its own loss from the whole
            batch (``model(**batch)`` for a dict, as Hugging Face models take
            it; its output's ``.loss``), in training and evaluation alike.
            A subclass may override :meth:`compute_loss` instead.
        eval_loader: batches (or a dataset, batched by ``eval_batch_size``)
            evaluated every ``eval_period`` iterations (default: every epoch
            when the epoch length is known) and at the end.
        metrics: what evaluation computes (default ``["loss"]``): metric
            names (``treadle.evaluation.available_metrics()``), names with
            options (``("cer", {"decode": fn})``, ``("perplexity",
            {"shift_labels": True})``), torchmetrics ``Metric`` or
            ``MetricCollection`` objects, or ``DatasetEvaluator``s. An
            unknown name is an error here, not at the first evaluation.
        max_iter, max_epochs: the run length; with both, whichever comes first.
        scheduler: a torch scheduler, an fvcore ``ParamScheduler``, a name
            (``"cosine"``, ``"linear"``, ``"step"``, ``"constant"``), or a factory
            ``(optimizer, max_iter) -> scheduler`` (or ``(optimizer)``, as
            pytorch-accelerated's ``create_scheduler_fn``); ``warmup_iters``
            adds a linear warm-up to a named schedule as Hugging Face's
            ``get_*_schedule_with_warmup``: from 0 to the full rate, then the
            schedule over the remaining iterations (clipped to half the run,
            with a warning, when it is not shorter than the run).
            ``ReduceLROnPlateau`` is refused (it steps on a metric). Without
            one (and without ``warmup_iters``) nothing sets the rate: it is
            the optimizer's, and a callback or hook that changes it (``for g
            in trainer.optimizer.param_groups: g["lr"] *= 0.5``) changes it
            for the rest of the run, resumes included (:class:`~treadle.hooks.LRMonitor`).
        scheduler_interval: when a torch scheduler steps: ``"iter"`` or
            ``"epoch"`` (Lightning's ``interval``); logged when training starts.
        batch_size, eval_batch_size, shuffle, collate_fn, num_workers: how
            datasets given as ``train_loader``/``eval_loader`` are batched
            (``eval_batch_size`` defaults to ``batch_size``; Hezar's
            ``data_collator`` is ``collate_fn``). ``batch_size`` and
            ``eval_batch_size`` are per process (the seeds' convention).
        total_batch_size: instead of ``batch_size``, the samples of one
            step over all processes (the configs' convention: the same run
            on any number of processes); giving both is an error.
        ddp: how the model is wrapped when several processes train:
            ``"ddp"`` (``DistributedDataParallel``, the default) or
            ``"fsdp"`` (FSDP2 sharding), or a dict of ``train.ddp``'s options
            with its ``kind`` (``{"kind": "fsdp", "reshard_after_forward":
            False}``). Nothing is wrapped on one process.
        dist_timeout: seconds that joining torchrun's process group and
            each collective may wait for the other processes (configs'
            ``train.dist_timeout``); past it a process exits with one line,
            so that torchrun's ``--max-restarts`` restarts the group
            (``docs/distributed.md``, "Fault-tolerant runs").
        hooks: more hooks, run after evaluation and the epoch's history and
            before checkpoints and writers; a hook the evaluation must follow
            (``PreciseBN``) is placed before it (the default hooks and this
            rule: :mod:`treadle.engine.default_hooks`, ``docs/defaults.md``).
        callbacks: ``fn(trainer, epoch, metrics)`` called at each epoch's end
            with that epoch's row of the history (its evaluation included).
        output_dir: where ``metrics.json``, TensorBoard events, ``log.txt`` and
            checkpoints go; nothing is written without it. The folder rules
            (one job at a time, no silent overwrite) are in ``docs/checkpoints.md``.
        checkpoints_dir, logs_dir: subfolders of ``output_dir`` for the
            checkpoints and for the logs and metrics (Hezar's layout:
            ``checkpoints_dir="checkpoints", logs_dir="logs"``); by default
            everything is in ``output_dir``.
        loggers: the files written: ``"json"`` (``metrics.json``),
            ``"tensorboard"``, ``"csv"`` (``metrics.csv``); the trackers
            ``"mlflow"`` and ``"wandb"`` (optional extras); or
            :class:`~treadle.events.EventWriter` objects, e.g.
            ``MLflowWriter(tracking_uri=..., experiment_name=...)``.
        precision, grad_accum_steps, clip_grad_norm, clip_grad_value: as
            ``EagerStep`` (clipping by norm or by value, not both).
        compile: use ``CompiledStep``; a dict is passed to ``torch.compile``.
        device: ``"auto"`` (cuda, mps, cpu), or a device.
        seed: seeds python, numpy and torch before training, and the data order.
        log_period, eval_period, checkpoint_period: in iterations
            (``checkpoint_period`` defaults to an epoch; Hezar's ``save_steps``).
        max_to_keep: periodic checkpoints kept.
        ema_decay: keep an EMA of the weights and evaluate with it.
        best_metric: save ``model_best.pth`` when this evaluation result
            improves (needs ``output_dir``); prefixes such as ``"eval/"``,
            ``"evaluation."``, ``"eval_"`` are accepted, and ``"train/..."``
            names a training scalar. ``best_mode`` (``"min"``/``"max"``)
            overrides the direction inferred from the metric.
        early_stopping_patience: stop after that many evaluations without
            improvement of ``best_metric`` (or of the evaluation ``loss``,
            evaluated with a warning where ``metrics`` leave it out). A
            ``best_mode`` against the metric's known direction is warned about.
        init_weights_from: a checkpoint whose matching weights are loaded
            into the model first (Hezar's ``init_weights_from``; a new head
            is fine: mismatched keys are reported and skipped).
        progress_bar: a tqdm bar; ``None`` shows it when stderr is a terminal
            (console metric lines are printed otherwise).
        evaluate_with_generate: the metrics are computed on
            ``model.generate(...)``'s outputs instead of the forward's
            (Hezar's ``evaluate_with_generate``, Hugging Face's
            ``predict_with_generate``): ``generate(**batch)`` without its
            ``labels`` for a dict batch, ``generate(inputs)`` for an
            ``(inputs, targets)`` pair; a dict is passed to ``generate``
            (``{"max_new_tokens": 8}``). Give the metrics a ``decode`` (token
            ids to strings: ``("cer", {"decode": fn, "decode_targets": fn})``).
            The evaluation ``loss`` is still the forward's, as in training.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Union[torch.optim.Optimizer, str],
        train_loader: Iterable[Any],
        *,
        loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None,
        eval_loader: Optional[Iterable[Any]] = None,
        metrics: Sequence[Any] = (),
        max_iter: Optional[int] = None,
        max_epochs: Optional[int] = None,
        scheduler: Union[None, str, ParamScheduler, torch.optim.lr_scheduler.LRScheduler, Callable[..., Any]] = None,
        scheduler_interval: str = "iter",
        warmup_iters: int = 0,
        lr: Optional[float] = None,
        weight_decay: float = 0.0,
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
        unknown_loggers = [name for name in loggers if not isinstance(name, EventWriter) and name not in LOGGERS]
        if unknown_loggers:
            raise ValueError(f"Unknown loggers {unknown_loggers}; choose from {list(LOGGERS)}")
        if scheduler_interval not in ("iter", "epoch"):
            raise ValueError(f"scheduler_interval must be 'iter' or 'epoch', got {scheduler_interval!r}")
        # Named here: torch's own messages for these ("'<' not supported between
        # instances of 'str' and 'float'", "total_batch_size must be >= 1") do not.
        if lr is not None and not (is_number(lr) and lr > 0):
            raise ValueError(f"lr must be a positive number, got {lr!r}")
        for name, size in (("batch_size", batch_size), ("total_batch_size", total_batch_size), ("eval_batch_size", eval_batch_size)):
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {size!r}")
        if batch_size is not None and total_batch_size is not None:
            raise ValueError(
                f"batch_size={batch_size} (per process) and total_batch_size={total_batch_size} (over all processes) "
                "were both given: give one"
            )
        ddp_kind, ddp_options = _wrapper_options(ddp)
        if ddp_kind == "fsdp" and ema_decay is not None:
            raise ValueError("ema_decay is not supported with ddp='fsdp': the EMA keeps an unsharded copy of the weights")
        # Under torchrun the processes meet here (launch() has joined them
        # before calling the user's function); they leave at exit.
        if not (is_number(dist_timeout) and dist_timeout > 0):
            raise ValueError(f"dist_timeout must be a positive number of seconds, got {dist_timeout!r}")
        if join_env_process_group(datetime.timedelta(seconds=dist_timeout)):
            atexit.register(leave_process_group)
        self.output_dir = output_dir
        self.checkpoint_dir = _inside(output_dir, checkpoints_dir)
        self.logs_dir = _inside(output_dir, logs_dir)
        if output_dir is not None:
            check_output_dir(output_dir)
        # log.txt starts when train() has claimed the folder: nothing is
        # written into it before (see docs/checkpoints.md).
        setup_logger(output=self.logs_dir, distributed_rank=comm.get_rank(), defer_file=True)
        if seed is not None:
            seed_all_rng(seed)
        self.device = resolve_device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())  # this process's GPU
        model.to(self.device)
        if init_weights_from:
            load_matching_weights(model, init_weights_from)
        if not isinstance(optimizer, (str, torch.optim.Optimizer)):
            raise TypeError(f"optimizer must be a torch optimizer or a name, got {type(optimizer).__name__}")
        if not isinstance(optimizer, str) and lr is not None:
            raise ValueError("lr is for an optimizer given by name; this optimizer has its own learning rate")
        #: The model as trained: wrapped in DDP (or sharded) on several processes.
        self.model = wrap_model(model, ddp_kind, **ddp_options)
        if isinstance(optimizer, str):
            optimizer = build_optimizer(optimizer, model, lr=lr, weight_decay=weight_decay)
        elif ddp_kind == "fsdp" and comm.get_world_size() > 1:
            _check_optimizer_holds(optimizer, model)
        self.loss_fn = loss_fn
        self.optimizer = optimizer

        self.train_loader = _as_train_loader(train_loader, batch_size, total_batch_size, num_workers, seed, shuffle, collate_fn)
        self.eval_loader = _as_eval_loader(eval_loader, eval_batch_size, batch_size, num_workers, collate_fn)
        epoch_length = loader_epoch_length(self.train_loader, grad_accum_steps)
        run_length = _run_length(max_iter, max_epochs, epoch_length)
        batches = loader_batches(self.train_loader)
        if max_epochs is not None and batches and grad_accum_steps > 1 and batches % grad_accum_steps:
            # Hugging Face, Lightning and pytorch-accelerated end each epoch
            # with a shorter update instead; said here rather than found out
            # from weights that differ.
            if batches < grad_accum_steps:
                logger.warning(
                    "%d batches per epoch is fewer than grad_accum_steps=%d: an epoch counts as 1 update, "
                    "which takes batches of the next pass too", batches, grad_accum_steps,
                )
            else:
                logger.warning(
                    "%d batches per epoch is not a multiple of grad_accum_steps=%d: an epoch is %d updates "
                    "(%d batches), and the %d batches left over begin the next epoch's first update",
                    batches, grad_accum_steps, epoch_length, epoch_length * grad_accum_steps,
                    batches % grad_accum_steps,
                )
        if callbacks and not epoch_length:
            raise ValueError("callbacks are called at each epoch's end, and this train_loader has no length (no epochs)")

        # A subclass's compute_loss is the loss of training and evaluation alike.
        self._own_loss = self.compute_loss if type(self).compute_loss is not Trainer.compute_loss else None
        compile_options = compile if isinstance(compile, dict) else None
        step = build_step(
            "compiled" if compile else "eager",
            self.model,
            self.train_loader,
            self.optimizer,
            compile_options=compile_options,
            loss_fn=loss_fn,
            grad_accum_steps=grad_accum_steps,
            clip_grad_norm=clip_grad_norm,
            clip_grad_value=clip_grad_value,
            precision=precision,
            compute_loss=self._own_loss,
        )
        super().__init__(step, history_length=min(max(run_length, 10_000), _MAX_HISTORY))
        self.max_iter = run_length
        self.epoch_length = epoch_length
        self.history = TrainingHistory()
        self._pause_after_epoch: Optional[int] = None
        if evaluate_with_generate:
            if not isinstance(evaluate_with_generate, (bool, dict)):
                raise TypeError(f"evaluate_with_generate must be True or a dict of generate() arguments, got {evaluate_with_generate!r}")
            if not callable(getattr(getattr(self.model, "module", self.model), "generate", None)):
                raise ValueError(f"evaluate_with_generate needs a model with a generate() method; {type(self.model).__name__} has none")
        self._generate_options: Optional[Dict[str, Any]] = (
            dict(evaluate_with_generate) if isinstance(evaluate_with_generate, dict) else {} if evaluate_with_generate else None
        )
        # Where the evaluation forward generates, its loss is the training forward's (_forward_loss).
        self._training_forward_loss = LossEvaluator(**({"loss_fn": loss_fn} if loss_fn is not None else {}))
        # Without metrics, evaluation (eval_loader's or evaluate(loader)'s) reports the loss.
        self.metrics = list(metrics) or ["loss"]
        self.evaluator = self._build_evaluator() if self.eval_loader is not None else None
        self._watch_loss_for_early_stopping(best_metric, early_stopping_patience)
        # The loss of an evaluation batch, computed as training computes it.
        self._eval_loss = LossEvaluator(**self._loss_options())
        # The evaluation forward feeds batches as training does; a subclass's
        # compute_loss runs the model itself, so there only metrics other
        # than the loss need the outputs.
        only_loss = all(isinstance(m, str) and m == "loss" for m in self.metrics)
        self._forward = forward_for(loss_fn) if self._own_loss is None else _no_outputs if only_loss else default_forward
        if self._generate_options is not None:
            self._forward = functools.partial(_generate_forward, options=self._generate_options)
        self.checkpointer: Optional[Checkpointer] = None
        self.run_folder: Optional[RunFolder] = None
        if output_dir is not None:
            self.checkpointer = Checkpointer(unwrap_model(self.model), self.checkpoint_dir, optimizer=self.optimizer, trainer=self)
            self.run_folder = RunFolder(
                output_dir, names=RunFolder.TRAINER_API, subdirs=[d for d in (checkpoints_dir, logs_dir) if d]
            )
        watched, mode = self._watched_metric(best_metric, best_mode, early_stopping_patience)

        sched = resolve_scheduler(scheduler, self.optimizer, self.max_iter, warmup_iters=warmup_iters)
        if scheduler_interval == "epoch" and isinstance(sched, ParamScheduler):
            raise ValueError("scheduler_interval='epoch' is for torch schedulers; a named or fvcore schedule is per iteration")
        if eval_period is None:
            eval_period = epoch_length or 0
        if checkpoint_period is None:
            checkpoint_period = epoch_length or 0
        show_bar = (progress_bar if progress_bar is not None else _stderr_is_a_terminal()) and comm.is_main_process()
        total_batch = getattr(self.train_loader, "total_batch_size", None)
        self.register_hooks(default_hooks(
            optimizer=self.optimizer,
            # None: the rate is the optimizer's, which a callback may change as
            # in a hand-written loop; LRMonitor publishes it all the same.
            scheduler=sched,
            scheduler_interval=scheduler_interval,
            ema_decay=ema_decay,
            evaluate=self.evaluate if self.eval_loader is not None else None,
            eval_period=eval_period,
            checkpointer=self.checkpointer,
            best_metric=watched if best_metric else None,
            best_mode=mode,
            stop_metric=watched if early_stopping_patience else None,
            stop_patience=early_stopping_patience,
            stop_mode=mode,
            epochs=self.history.epochs if epoch_length else None,
            epoch_callbacks=callbacks,
            checkpoint_period=checkpoint_period,
            max_to_keep=max_to_keep,
            writers=self._writers(loggers, console=not show_bar),
            log_period=log_period,
            progress_bar=show_bar,
            output_dir=self.output_dir,
            # One iteration is one update: grad_accum_steps batches.
            samples_per_iter=total_batch * grad_accum_steps if total_batch else None,
            user_hooks=list(hooks),
        ))

    def _build_evaluator(self) -> Any:
        names = [m if isinstance(m, str) else m[0] if isinstance(m, (tuple, list)) else None for m in self.metrics]
        return build_evaluator(self.metrics, **(self._loss_options() if "loss" in names else {}))

    def _loss_options(self) -> Dict[str, Any]:
        """How evaluation computes the loss (:class:`LossEvaluator`'s options):
        as training does, by a subclass's :meth:`compute_loss`, else ``loss_fn``,
        else from the model's outputs."""
        if self._own_loss is not None:
            return {"compute_loss": self._own_loss}
        if self._generate_options is not None:  # the evaluation forward's outputs are generated tokens
            return {"compute_loss": self._forward_loss}
        return {"loss_fn": self.loss_fn} if self.loss_fn is not None else {}

    def _forward_loss(self, batch: Any) -> torch.Tensor:
        """The evaluation loss where the evaluation forward generates: the
        training forward's (``evaluate_with_generate``)."""
        outputs = forward_for(self.loss_fn)(self.model, batch)
        return self._training_forward_loss.batch_loss(batch, outputs).mean()

    def _watched_metric(self, best_metric: Optional[str], best_mode: Optional[str], patience: Optional[int]) -> Any:
        """The storage name and direction of the metric that best checkpoints
        and early stopping watch, checked against the evaluation's results."""
        if best_metric is None and not patience:
            return None, None
        if patience is not None and (not isinstance(patience, int) or patience < 1):
            raise ValueError(f"early_stopping_patience must be an integer >= 1, got {patience!r}")
        if best_mode not in (None, "min", "max"):
            raise ValueError(f"best_mode must be 'min', 'max' or None, got {best_mode!r}")
        if self.evaluator is None and not (best_metric or "").startswith(_TRAIN_PREFIXES):
            raise ValueError("best_metric and early_stopping_patience watch an evaluation: give eval_loader")
        if best_metric and self.checkpointer is None:
            raise ValueError("best_metric saves model_best.pth: give output_dir")
        # validation.py checks configs (OmegaConf), which a plain Trainer never imports otherwise.
        from .validation import check_watched_metric, warn_contradicting_mode

        # The key the warnings name: the metric given, or the one early stopping watches without it.
        given = ("best_metric", best_metric) if best_metric is not None else ("early stopping's metric", "loss")
        name = best_metric or "loss"
        for prefix in _EVAL_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        else:
            for prefix in _TRAIN_PREFIXES:
                if name.startswith(prefix):
                    name = name[len(prefix):]
                    name = "total_loss" if name == "loss" else name
                    warn_contradicting_mode("best_mode", best_mode, *given, known_metric_mode(name))
                    return name, best_mode or metric_mode(name)
        check_watched_metric("best_metric", name, getattr(self.evaluator, "result_names", None))
        declared = _declared_direction(self.evaluator, name)
        known = ("max" if declared else "min") if declared is not None else known_metric_mode(name)
        warn_contradicting_mode("best_mode", best_mode, *given, known)
        return name, best_mode or known or metric_mode(name)

    def _watch_loss_for_early_stopping(self, best_metric: Optional[str], patience: Optional[int]) -> None:
        """Early stopping without ``best_metric`` watches the evaluation
        ``loss``; where ``metrics`` leave it out, it is added to the
        evaluation, with a warning naming the settings (rather than an error
        about a ``best_metric`` the user never set)."""
        if best_metric is not None or not patience or self.evaluator is None:
            return
        known = getattr(self.evaluator, "result_names", None)
        if known is None or "loss" in known:
            return
        logger.warning(
            "early_stopping_patience=%r watches the evaluation 'loss' (no best_metric is given), which the "
            "metrics leave out (the evaluation computes: %s): the loss is evaluated too; give best_metric= to "
            "watch another metric", patience, ", ".join(sorted(known)),
        )
        self.metrics.append("loss")
        self.evaluator = self._build_evaluator()

    def _writers(self, loggers: Sequence[Any], *, console: bool) -> List[Any]:
        """The writers ``loggers`` names, and the console printer where no
        progress bar shows the losses; none on other processes than the main one."""
        if not comm.is_main_process():
            return []
        writers: List[Any] = []
        if console:
            writers.append(CommonMetricPrinter(self.max_iter))
        if self.logs_dir is not None:
            files = {
                "json": lambda: JSONWriter(os.path.join(self.logs_dir, "metrics.json")),
                "tensorboard": lambda: TensorboardWriter(self.logs_dir),
                "csv": lambda: CSVWriter(os.path.join(self.logs_dir, "metrics.csv")),
            }
            writers += [files[name]() for name in loggers if name in files]
        trackers = {"mlflow": lambda: MLflowWriter(), "wandb": lambda: WandbWriter(dir=self.logs_dir)}
        writers += [trackers[name]() for name in loggers if isinstance(name, str) and name in trackers]
        writers += [w for w in loggers if isinstance(w, EventWriter)]
        return writers

    # ------------------------------------------------------------------ running
    def train(self, resume: Union[bool, str] = False, *, move_aside: bool = False) -> TrainingHistory:  # type: ignore[override]
        """Trains to ``max_iter`` and returns the :class:`TrainingHistory`.

        ``resume=True`` continues exactly from the last checkpoint of
        ``output_dir``; ``resume="path/to/model_0000019.pth"`` from that
        checkpoint (Hezar's ``resume_from_checkpoint``): model, optimizer,
        schedule, hooks, random states and data position, then the
        iterations after it. Learning rate and other optimizer settings given
        to this ``Trainer`` are kept over the checkpoint's (a warning names
        each).

        The ``output_dir`` is claimed first: another job running there, or a
        fresh start (``resume=False``) in a folder holding an earlier run
        (a second ``train()`` too), is refused with a
        :class:`~treadle.utils.run_folder.RunFolderError`, unless
        ``move_aside=True`` renames the earlier run's folder to
        ``{output_dir}.old-{date}-{time}``. Nothing is deleted.
        """
        if resume is True and self.checkpointer is None:
            raise ValueError("resume=True needs an output_dir with checkpoints; or give resume='path/to/checkpoint.pth'")
        if not isinstance(resume, (bool, str, os.PathLike)):
            raise TypeError(f"resume must be True, False or a checkpoint path, got {resume!r}")
        return self._run(resume, move_aside=move_aside)

    def train_epoch(self) -> Dict[str, float]:
        """Trains the next epoch and returns its row of the history (qurious'
        ``train_epoch``): ``train_loss`` and the other training means, and the
        evaluation results of the epoch's end when there is an ``eval_loader``.

        Each call goes on where the last one stopped (epoch 0, 1, 2, ...; after
        a ``train()`` stopped early, from where it stopped), in this process:
        model, optimizer, schedule, data order and random states continue, so
        ``n`` calls give the rows, and the weights, of one ``train()`` of
        ``n`` epochs. Between calls the run is paused as a preempted one is
        (no final evaluation, no ``model_final``, periodic checkpoints as
        usual); the call that trains the run's last epoch ends it as
        ``train()`` does. ``history.epochs`` holds every row so far.
        """
        if not self.epoch_length:
            raise ValueError("train_epoch() needs data with a length (the epoch length is not known)")
        start = self.last_run_iter + 1
        if start >= self.max_iter:
            raise RuntimeError(f"train_epoch(): every iteration of the run (max_iter={self.max_iter}) has been trained")
        self._pause_after_epoch = start // self.epoch_length
        try:
            self._run(False, continuing=start > 0)
        finally:
            self._pause_after_epoch = None
        return dict(self.history.epochs[-1])

    def after_epoch(self) -> None:
        super().after_epoch()
        # train_epoch(): pause after its epoch, unless that is the run's last
        # (then training ends as train() ends it).
        if self._pause_after_epoch == self.epoch and (self.epoch + 1) * self.epoch_length < self.max_iter:
            self.request_stop(f"train_epoch(): epoch {self.epoch} done", interrupted=True)

    def _run(self, resume: Union[bool, str], *, move_aside: bool = False, continuing: bool = False) -> TrainingHistory:
        """``train()``'s body; ``continuing``: go on from where this process's
        last training stopped (``train_epoch()``), with its recent values."""
        if self.run_folder is not None:
            claim_on_main_process(self.run_folder, resume=bool(resume) or continuing, move_aside=move_aside)
        try:
            start_iter = 0
            if continuing:
                start_iter = self.last_run_iter + 1
                self._restored_storage = self.storage.recent_state()
            elif resume:
                snapshot = take_hyperparameters(self.optimizer, self.hooks)
                if resume is True:
                    extra = self.checkpointer.resume_or_load("", resume=True)  # type: ignore[union-attr]
                else:
                    extra = self._checkpoint_io().load(os.fspath(resume), strict=True)
                if "iteration" in extra:
                    start_iter = int(extra["iteration"]) + 1
                    restore_hyperparameters(snapshot, self.optimizer, self.hooks)
            if self.has_work(start_iter, self.max_iter):
                start_log_files()
            super().train(start_iter, self.max_iter)
        finally:
            if self.run_folder is not None:
                self.run_folder.release()
        if hasattr(self, "storage"):
            self.history.iterations = _iteration_history(self)
        return self.history

    def evaluate(self, loader: Optional[Iterable[Any]] = None) -> Dict[str, Any]:
        """Evaluates the model on ``loader`` (default: ``eval_loader``) with
        ``metrics``; without metrics, its ``loss`` (computed as in training)."""
        loader = _per_process(loader, train=False) if loader is not None else self.eval_loader
        if loader is None:
            raise ValueError("Trainer.evaluate needs a loader: pass one or give eval_loader to the Trainer")
        evaluator = self.evaluator if self.evaluator is not None else self._build_evaluator()
        return inference_on_dataset(self.model, loader, evaluator, device=self.device, forward=self._forward)

    # ------------------------------------------------------------------ one batch
    def compute_loss(self, batch: Any) -> Any:
        """The loss of one batch (already on the device). Override it in a
        subclass for a custom loss (pytorch-accelerated's
        ``calculate_train_batch_loss``): return a scalar tensor, a dict of
        scalar losses or an object with ``.loss``. Precision, gradient
        accumulation, clipping and the optimizer step stay the step's. The
        override is the loss everywhere: training, :meth:`train_step`,
        :meth:`eval_step` and the ``loss`` of :meth:`evaluate` (run in eval
        mode without gradients there), hence of ``best_metric`` and early
        stopping on it."""
        return self.step.compute_loss(batch)

    def train_step(self, batch: Any) -> Dict[str, float]:
        """One optimizer update on ``batch``, outside :meth:`train` (a notebook's
        loop): returns the losses as floats, ``loss`` being their total. No
        hook runs (the schedule does not advance)."""
        losses = self.step.train_on_batch(batch)
        out = {"loss": float(losses.pop("total_loss"))}
        out.update({name: float(value) for name, value in losses.items()})
        return out

    @torch.no_grad()
    def eval_step(self, batch: Any) -> Dict[str, float]:
        """The loss and ``metrics`` of one batch, in eval mode: floats, by
        name. The loss is computed as in training (:meth:`compute_loss`)."""
        batch = move_to_device(batch, self.device)
        with inference_context(self.model):
            outputs = self._forward(self.model, batch)
            out = {"loss": float(self._eval_loss.batch_loss(batch, outputs).float().mean())}
            if self.evaluator is not None:
                self.evaluator.reset()
                self.evaluator.process(batch, outputs)
        if self.evaluator is not None:
            out.update({k: v for k, v in _flat_floats(self.evaluator.evaluate() or {}).items() if k != "loss"})
        return out

    # ------------------------------------------------------------------ checkpoints without an output_dir
    def _checkpoint_io(self) -> Checkpointer:
        return self.checkpointer or Checkpointer(unwrap_model(self.model), "", optimizer=self.optimizer, trainer=self)

    def save_checkpoint(self, path: str, **extra: Any) -> Optional[str]:
        """Writes a full checkpoint (model, optimizer, schedule, hooks, random
        states, data position) to ``path``, atomically, with ``extra`` values;
        ``output_dir`` is not needed. Returns the path."""
        return self._checkpoint_io().save_file(os.fspath(path), iteration=self.last_run_iter, **extra)

    def load_checkpoint(self, path: str, load_optimizer: bool = True, load_scheduler: bool = True) -> Dict[str, Any]:
        """Loads the model's weights from ``path`` (qurious' and
        pytorch-accelerated's ``load_checkpoint``), and the optimizer's and the
        schedule's states unless told not to. Training then starts at
        iteration 0 with these states; to continue the run where the
        checkpoint left it, use ``train(resume=path)``. Returns what else the
        file holds (``iteration``...)."""
        io = self._checkpoint_io()
        rest = io.load(os.fspath(path), checkpointables=["optimizer"] if load_optimizer else [])
        trainer_state = rest.get("trainer") or {}
        if load_scheduler:
            for key, hook in self.hook_state_keys().items():
                if isinstance(hook, LRScheduler) and key in trainer_state.get("hooks", {}):
                    hook.load_state_dict(trainer_state["hooks"][key])
        return rest


# ---------------------------------------------------------------------- helpers
def _generate_forward(model: Any, batch: Any, *, options: Dict[str, Any]) -> Any:
    """The evaluation forward of ``evaluate_with_generate``: ``generate`` on the
    batch's inputs (a DDP wrapper's module generates)."""
    generate = getattr(model, "module", model).generate
    if isinstance(batch, Mapping):
        return generate(**{k: v for k, v in batch.items() if k != "labels"}, **options)
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return generate(batch[0], **options)
    return generate(batch, **options)


def _no_outputs(model: Any, batch: Any) -> None:
    """The evaluation forward where nothing reads the outputs (the loss is a compute_loss's)."""
    return None


def _inside(output_dir: Optional[str], sub: Optional[str]) -> Optional[str]:
    if output_dir is None:
        if sub:
            raise ValueError(f"checkpoints_dir/logs_dir ({sub!r}) are folders inside output_dir: give output_dir")
        return None
    return os.path.join(output_dir, sub) if sub else output_dir


def _declared_direction(evaluator: Any, name: str) -> Optional[bool]:
    """``higher_is_better`` of a torchmetrics result ``name``, when one declares it."""
    parts = getattr(evaluator, "evaluators", None) or [evaluator]
    for part in parts:
        declared = getattr(part, "higher_is_better", None)
        if isinstance(declared, dict) and declared.get(name) is not None:
            return bool(declared[name])
    return None


def _flat_floats(results: Dict[str, Any], prefix: str = "") -> Dict[str, float]:
    out: Dict[str, float] = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat_floats(value, f"{name}/"))
        else:
            out[name] = float(value)
    return out


def _stderr_is_a_terminal() -> bool:
    # What ProgressBar(disable=None) decides, decided here because the
    # console printer is written only where no bar shows the losses.
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _wrapper_options(ddp: Union[str, Dict[str, Any]]) -> Any:
    """The wrapper's kind and options from ``ddp=``: a kind, or ``train.ddp``'s dict."""
    if isinstance(ddp, str):
        return ddp, {}
    if isinstance(ddp, Mapping):
        options = dict(ddp)
        return options.pop("kind", "ddp"), options
    raise TypeError(f"ddp must be 'ddp', 'fsdp' or a dict of train.ddp options, got {ddp!r}")


def _check_optimizer_holds(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """FSDP2 replaces the model's parameters by shards: an optimizer built
    before would step tensors the model no longer uses."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not all(id(p) in held for p in model.parameters() if p.requires_grad):
        raise ValueError(
            "with ddp='fsdp' the model's parameters are replaced by shards, so this optimizer (built before) "
            "does not hold them: give the optimizer by name (optimizer='adamw', lr=...)"
        )


def _as_train_loader(
    data: Any,
    batch_size: Optional[int],
    total_batch_size: Optional[int],
    num_workers: int,
    seed: Optional[int],
    shuffle: bool,
    collate_fn: Any,
) -> Iterable[Any]:
    is_dataset = isinstance(data, torch.utils.data.Dataset) and not isinstance(data, torch.utils.data.IterableDataset)
    if is_dataset:
        if batch_size is None and total_batch_size is None:
            raise ValueError(
                "train_loader is a dataset: give batch_size=... (per process) or total_batch_size=... (over all "
                "processes) to batch it (or pass a DataLoader)"
            )
        world = comm.get_world_size()
        # A total the processes cannot share evenly is refused by the loader, in one line.
        loader = build_train_loader(
            data, total_batch_size=total_batch_size or batch_size * world, num_workers=num_workers,  # type: ignore[operator]
            seed=seed or 0, shuffle=shuffle, collate_fn=collate_fn,
        )
        if total_batch_size is None:
            logger.info("Batches: batch_size=%d per process x %d process(es) = %d samples per step",
                        batch_size, world, loader.total_batch_size)
        else:
            logger.info("Batches: total_batch_size=%d over %d process(es) = %d samples per process",
                        total_batch_size, world, loader.batch_size)
        return loader
    if batch_size is not None or total_batch_size is not None:
        raise ValueError("batch_size and total_batch_size are for a dataset; this train_loader makes its own batches")
    if collate_fn is not None:
        raise ValueError("collate_fn is for a dataset; this train_loader makes its own batches")
    # An object with __getitem__ alone is iterable too (Python's sequence protocol).
    if not (hasattr(data, "__iter__") or hasattr(type(data), "__getitem__")):
        raise TypeError(f"train_loader must be an iterable of batches or a dataset, got {type(data).__name__}")
    return _per_process(data, train=True, seed=seed)


def _per_process(loader: Any, *, train: bool, seed: Optional[int] = None) -> Any:
    """``loader`` as one process of several reads it. A torch ``DataLoader``
    over a map-style dataset with a plain sampler is re-batched with treadle's
    sharded samplers (its batch size per process, its order when it
    shuffles: treadle's seeded one), as Lightning replaces the sampler:
    without it every process would train on every batch. Anything else is
    read as given, with a warning unless it is sharded already."""
    world = comm.get_world_size()
    if world == 1 or not isinstance(loader, torch.utils.data.DataLoader):
        if world > 1 and not isinstance(loader, TrainLoader):  # treadle's loaders are sharded when built
            logger.warning(
                "%s is not a DataLoader: every one of the %d processes reads all of it; shard it yourself, "
                "or give the dataset with batch_size=", type(loader).__name__, world,
            )
        return loader
    plain = type(loader.sampler) in (torch.utils.data.SequentialSampler, torch.utils.data.RandomSampler)
    if not (plain and loader.batch_size is not None and isinstance(loader.dataset, torch.utils.data.Dataset)
            and not isinstance(loader.dataset, torch.utils.data.IterableDataset)):
        if not isinstance(loader.sampler, (torch.utils.data.DistributedSampler, InferenceSampler)):
            logger.warning(
                "The %s DataLoader's sampler (%s) is not sharded: every one of the %d processes reads all of it",
                "training" if train else "evaluation", type(loader.sampler).__name__, world,
            )
        return loader
    logger.info(
        "The %s DataLoader is sharded over %d processes: batch_size=%d per process",
        "training" if train else "evaluation", world, loader.batch_size,
    )
    # Batched as a dataset given to the Trainer is, with the DataLoader's settings.
    if train:
        shuffle = isinstance(loader.sampler, torch.utils.data.RandomSampler)
        return _as_train_loader(loader.dataset, loader.batch_size, None, loader.num_workers, seed, shuffle, loader.collate_fn)
    return _as_eval_loader(loader.dataset, loader.batch_size, None, loader.num_workers, loader.collate_fn)


def _as_eval_loader(
    data: Any, eval_batch_size: Optional[int], batch_size: Optional[int], num_workers: int, collate_fn: Any
) -> Optional[Iterable[Any]]:
    if data is None:
        return None
    is_dataset = isinstance(data, torch.utils.data.Dataset) and not isinstance(data, torch.utils.data.IterableDataset)
    if not is_dataset:
        # As for train_loader: anything else (a list included) is taken as
        # its batches, so a batch size given for it would silently be ignored.
        if eval_batch_size is not None:
            raise ValueError(
                f"eval_batch_size is for a dataset; this eval_loader ({type(data).__name__}) is taken as its own "
                "batches. Pass a torch Dataset to have it batched (a list of examples is not one)"
            )
        return _per_process(data, train=False)
    batch_size = eval_batch_size or batch_size
    if batch_size is None:
        raise ValueError("eval_loader is a dataset: give eval_batch_size=... (or batch_size) to batch it")
    return build_test_loader(data, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_fn)


def _run_length(max_iter: Optional[int], max_epochs: Optional[int], epoch_length: Optional[int]) -> int:
    if max_iter is None and max_epochs is None:
        raise ValueError("Give max_iter or max_epochs (or both: training stops at whichever comes first)")
    lengths = []
    if max_epochs is not None:
        if epoch_length is None:
            raise ValueError("max_epochs needs data with a length; this train_loader has none, so give max_iter")
        if max_epochs <= 0:
            raise ValueError(f"max_epochs must be positive, got {max_epochs}")
        lengths.append(max_epochs * epoch_length)
    if max_iter is not None:
        if max_iter <= 0:
            raise ValueError(f"max_iter must be positive, got {max_iter}")
        lengths.append(max_iter)
    return min(lengths)


def _iteration_history(trainer: Trainer) -> Dict[str, List[Any]]:
    histories = trainer.storage.histories()  # the one read of this run's values
    return {name: [(int(it), v) for v, it in h.values()] for name, h in histories.items()}
