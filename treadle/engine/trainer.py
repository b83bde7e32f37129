"""The plain-object trainer: treadle's loop without configs.

For users of Hezar's ``Trainer``, pytorch-accelerated or a small
``Trainer(model, optimizer, loss_fn)`` class: the same engine, hooks, writers
and checkpoints as :class:`~treadle.engine.DefaultTrainer`, from objects.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from fvcore.common.param_scheduler import ConstantParamScheduler, ParamScheduler
from torch import nn

from treadle.checkpoint import Checkpointer
from treadle.data import build_train_loader
from treadle.evaluation import build_evaluator, inference_on_dataset
from treadle.events import CommonMetricPrinter, JSONWriter, ScalarKind, TensorboardWriter
from treadle.hooks import (
    EMA,
    EvalHook,
    HookBase,
    IterationTimer,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
    ProgressBar,
)
from treadle.utils import comm
from treadle.utils.device import resolve_device
from treadle.utils.env import seed_all_rng
from treadle.utils.logger import setup_logger, start_log_files
from treadle.utils.run_folder import RunFolder, check_output_dir, claim_on_main_process

from .build import build_optimizer, build_step, loader_epoch_length, resolve_scheduler
from .resume import restore_hyperparameters, take_hyperparameters
from .train_loop import TrainerBase

__all__ = ["Trainer", "TrainingHistory"]

logger = logging.getLogger(__name__)

# Per-iteration history is kept in memory for the returned history; beyond
# this many iterations the oldest values are dropped (global averages stay).
_MAX_HISTORY = 1_000_000


@dataclasses.dataclass
class TrainingHistory:
    """Every scalar of a run, per iteration and per epoch.

    Attributes:
        iterations: ``{name: [(iteration, value), ...]}`` for every scalar put
            (losses, lr, time, evaluation results).
        epochs: one dict per completed epoch: ``epoch``, ``iteration`` (its
            last), the mean of each training scalar over the epoch, and the
            evaluation results computed at its end. Empty when the data has
            no length.
    """

    iterations: Dict[str, List[Tuple[int, float]]] = dataclasses.field(default_factory=dict)
    epochs: List[Dict[str, float]] = dataclasses.field(default_factory=list)

    def __getitem__(self, name: str) -> List[float]:
        """The values of ``name`` in order."""
        if name not in self.iterations:
            raise KeyError(f"No scalar named '{name}' in the history; known: {sorted(self.iterations)}")
        return [v for _, v in self.iterations[name]]

    def __contains__(self, name: object) -> bool:
        return name in self.iterations

    def last(self, name: str) -> float:
        return self[name][-1]


class Trainer(TrainerBase):
    """Trains ``model`` from plain objects and returns its history.

    Example::

        trainer = Trainer(model, "adamw", train_loader, loss_fn=F.cross_entropy, lr=1e-3,
                          eval_loader=val_loader, metrics=["accuracy", "f1"], max_epochs=5)
        history = trainer.train()
        print(history.epochs[-1]["accuracy"])

    Args:
        model: the module to train; moved to ``device``.
        optimizer: an optimizer, or ``"sgd"``/``"adam"``/``"adamw"`` with
            ``lr`` and ``weight_decay`` (norms and biases get no decay).
        train_loader: an iterable of batches (a ``DataLoader``, a treadle
            ``TrainLoader``, a generator), or a map-style dataset with
            ``batch_size``, for which a resumable loader is built.
        loss_fn: ``loss_fn(model(inputs), targets)`` on ``(inputs, targets)``
            batches; without it the model returns its loss (see ``EagerStep``).
        eval_loader, metrics: evaluated with ``metrics`` (names, see
            ``treadle.evaluation.build_evaluator``; ``["loss"]`` by default
            when there is a ``loss_fn``) every ``eval_period`` iterations
            (default: every epoch when the epoch length is known) and at the end.
        max_iter, max_epochs: the run length; exactly one of them.
        scheduler: a torch scheduler, an fvcore ``ParamScheduler``, a name
            (``"cosine"``, ``"linear"``, ``"step"``, ``"constant"``), or a factory
            ``(optimizer, max_iter) -> scheduler``; ``warmup_iters`` adds a
            linear warm-up to a named schedule (clipped to half the run, with
            a warning, when it is not shorter than the run).
        hooks: more hooks, run after evaluation and before checkpoints and writers.
        output_dir: where ``metrics.json``, TensorBoard events, ``log.txt`` and
            checkpoints go; nothing is written without it.
        precision, grad_accum_steps, clip_grad_norm: as ``EagerStep``.
        compile: use ``CompiledStep``; a dict is passed to ``torch.compile``.
        device: ``"auto"`` (cuda, mps, cpu), or a device.
        seed: seeds python, numpy and torch before training, and the data order.
        ema_decay: keep an EMA of the weights and evaluate with it.
        progress_bar: a tqdm bar; ``None`` shows it when stderr is a terminal
            (console metric lines are printed otherwise).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Union[torch.optim.Optimizer, str],
        train_loader: Iterable[Any],
        *,
        loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None,
        eval_loader: Optional[Iterable[Any]] = None,
        metrics: Sequence[str] = (),
        max_iter: Optional[int] = None,
        max_epochs: Optional[int] = None,
        scheduler: Union[None, str, ParamScheduler, torch.optim.lr_scheduler.LRScheduler, Callable[..., Any]] = None,
        warmup_iters: int = 0,
        lr: Optional[float] = None,
        weight_decay: float = 0.0,
        batch_size: Optional[int] = None,
        num_workers: int = 0,
        hooks: Sequence[HookBase] = (),
        output_dir: Optional[str] = None,
        precision: str = "fp32",
        grad_accum_steps: int = 1,
        clip_grad_norm: Optional[float] = None,
        compile: Union[bool, Dict[str, Any]] = False,
        device: Union[str, torch.device] = "auto",
        seed: Optional[int] = None,
        log_period: int = 20,
        eval_period: Optional[int] = None,
        checkpoint_period: Optional[int] = None,
        max_to_keep: Optional[int] = 3,
        ema_decay: Optional[float] = None,
        progress_bar: Optional[bool] = None,
    ) -> None:
        if output_dir is not None:
            check_output_dir(output_dir)
        # log.txt starts when train() has claimed the folder: nothing is
        # written into it before (see docs/checkpoints.md).
        setup_logger(output=output_dir, distributed_rank=comm.get_rank(), defer_file=True)
        if seed is not None:
            seed_all_rng(seed)
        self.device = resolve_device(device)
        self.model = model.to(self.device)
        self.loss_fn = loss_fn
        if isinstance(optimizer, str):
            optimizer = build_optimizer(optimizer, self.model, lr=lr, weight_decay=weight_decay)
        elif not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch optimizer or a name, got {type(optimizer).__name__}")
        elif lr is not None:
            raise ValueError("lr is for an optimizer given by name; this optimizer has its own learning rate")
        self.optimizer = optimizer

        self.train_loader = _as_loader(train_loader, batch_size, num_workers, seed)
        self.eval_loader = eval_loader
        epoch_length = loader_epoch_length(self.train_loader, grad_accum_steps)
        run_length = _run_length(max_iter, max_epochs, epoch_length)

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
            precision=precision,
        )
        super().__init__(step, history_length=min(max(run_length, 10_000), _MAX_HISTORY))
        self.max_iter = run_length
        self.epoch_length = epoch_length
        self.output_dir = output_dir
        self.metrics = list(metrics) or (["loss"] if loss_fn is not None and eval_loader is not None else [])
        self.history = TrainingHistory()
        self.checkpointer: Optional[Checkpointer] = None
        self.run_folder: Optional[RunFolder] = None
        if output_dir is not None:
            self.checkpointer = Checkpointer(self.model, output_dir, optimizer=self.optimizer, trainer=self)
            self.run_folder = RunFolder(output_dir, names=RunFolder.TRAINER_API)

        # A constant schedule when none is given: the history always has lr.
        sched = resolve_scheduler(scheduler, self.optimizer, self.max_iter, warmup_iters=warmup_iters) or ConstantParamScheduler(1.0)
        if eval_period is None:
            eval_period = epoch_length or 0
        if checkpoint_period is None:
            checkpoint_period = epoch_length or 0
        self.register_hooks(
            self._default_hooks(sched, eval_period, checkpoint_period, max_to_keep, ema_decay, log_period, progress_bar, hooks)
        )

    def _default_hooks(
        self,
        scheduler: Any,
        eval_period: int,
        checkpoint_period: int,
        max_to_keep: Optional[int],
        ema_decay: Optional[float],
        log_period: int,
        progress_bar: Optional[bool],
        user_hooks: Sequence[HookBase],
    ) -> List[Optional[HookBase]]:
        show_bar = ProgressBar(log_period, disable=None if progress_bar is None else not progress_bar)
        writers = []
        if comm.is_main_process():
            if show_bar._disable:
                writers.append(CommonMetricPrinter(self.max_iter))
            if self.output_dir is not None:
                writers += [JSONWriter(os.path.join(self.output_dir, "metrics.json")), TensorboardWriter(self.output_dir)]
        return [
            IterationTimer(),
            LRScheduler(self.optimizer, scheduler) if scheduler is not None else None,
            EMA(ema_decay) if ema_decay is not None else None,
            EvalHook(eval_period, self.evaluate) if self.eval_loader is not None else None,
            *user_hooks,
            PeriodicCheckpointer(self.checkpointer, checkpoint_period, max_to_keep) if self.checkpointer else None,
            PeriodicWriter(writers, log_period),
            show_bar if not show_bar._disable else None,
        ]

    # ------------------------------------------------------------------ running
    def train(self, resume: bool = False, *, move_aside: bool = False) -> TrainingHistory:  # type: ignore[override]
        """Trains to ``max_iter`` and returns the :class:`TrainingHistory`.

        With ``resume=True`` and an ``output_dir`` holding checkpoints, training
        continues exactly from the last one; learning rate and other optimizer
        settings given to this ``Trainer`` are kept over the checkpoint's (a
        warning names each).

        The ``output_dir`` is claimed first: another job running there, or a
        fresh start (``resume=False``) in a folder holding an earlier run
        (a second ``train()`` too), is refused with a
        :class:`~treadle.utils.run_folder.RunFolderError`, unless
        ``move_aside=True`` renames the earlier run's folder to
        ``{output_dir}.old-{date}-{time}``. Nothing is deleted.
        """
        if resume and self.checkpointer is None:
            raise ValueError("resume=True needs an output_dir with checkpoints")
        if self.run_folder is not None:
            claim_on_main_process(self.run_folder, resume=resume, move_aside=move_aside)
        try:
            start_iter = 0
            if resume and self.checkpointer is not None:
                snapshot = take_hyperparameters(self.optimizer, self.hooks)
                extra = self.checkpointer.resume_or_load("", resume=True)
                if "iteration" in extra:
                    start_iter = int(extra["iteration"]) + 1
                    restore_hyperparameters(snapshot, self.optimizer, self.hooks)
            start_log_files()
            super().train(start_iter, self.max_iter)
        finally:
            if self.run_folder is not None:
                self.run_folder.release()
        if hasattr(self, "storage"):
            self.history = _collect_history(self)
        return self.history

    def evaluate(self, loader: Optional[Iterable[Any]] = None) -> Dict[str, Any]:
        """Evaluates the model on ``loader`` (default: ``eval_loader``) with ``metrics``."""
        loader = loader if loader is not None else self.eval_loader
        if loader is None:
            raise ValueError("Trainer.evaluate needs a loader: pass one or give eval_loader to the Trainer")
        if not self.metrics:
            raise ValueError("Trainer.evaluate needs metrics=[...] (or a loss_fn for the 'loss' metric)")
        options: Dict[str, Any] = {}
        if "loss" in self.metrics and self.loss_fn is not None:
            options["loss_fn"] = self.loss_fn
        evaluator = build_evaluator(self.metrics, **options)
        return inference_on_dataset(self.model, loader, evaluator, device=self.device)


# ---------------------------------------------------------------------- helpers
def _as_loader(data: Any, batch_size: Optional[int], num_workers: int, seed: Optional[int]) -> Iterable[Any]:
    is_dataset = isinstance(data, torch.utils.data.Dataset) and not isinstance(data, torch.utils.data.IterableDataset)
    if is_dataset:
        if batch_size is None:
            raise ValueError("train_loader is a dataset: give batch_size=... to batch it (or pass a DataLoader)")
        return build_train_loader(data, total_batch_size=batch_size, num_workers=num_workers, seed=seed or 0)
    if batch_size is not None:
        raise ValueError("batch_size is for a dataset; this train_loader makes its own batches")
    if not hasattr(data, "__iter__"):
        raise TypeError(f"train_loader must be an iterable of batches or a dataset, got {type(data).__name__}")
    return data


def _run_length(max_iter: Optional[int], max_epochs: Optional[int], epoch_length: Optional[int]) -> int:
    if (max_iter is None) == (max_epochs is None):
        raise ValueError("Give exactly one of max_iter and max_epochs")
    if max_epochs is not None:
        if epoch_length is None:
            raise ValueError("max_epochs needs data with a length; this train_loader has none, so give max_iter")
        return max_epochs * epoch_length
    assert max_iter is not None
    if max_iter <= 0:
        raise ValueError(f"max_iter must be positive, got {max_iter}")
    return max_iter


def _collect_history(trainer: Trainer) -> TrainingHistory:
    storage = trainer.storage
    histories = storage.histories()  # the one read of this run's values
    iterations = {name: [(int(it), v) for v, it in h.values()] for name, h in histories.items()}
    epochs: List[Dict[str, float]] = []
    length = trainer.epoch_length
    last_iter = trainer.iter - 1
    if length:
        rows: Dict[int, Dict[str, List[float]]] = {}
        results: Dict[int, Dict[str, float]] = {}
        for name, points in iterations.items():
            is_metric = storage.kind(name) == ScalarKind.METRIC
            for it, value in points:
                # The final evaluation is put one past the last iteration.
                epoch = min(it, last_iter) // length
                if is_metric:
                    results.setdefault(epoch, {})[name] = value
                else:
                    rows.setdefault(epoch, {}).setdefault(name, []).append(value)
        completed = (last_iter + 1) // length
        first = trainer.start_iter // length
        for epoch in range(first, completed):
            row: Dict[str, float] = {"epoch": epoch, "iteration": (epoch + 1) * length - 1}
            for name, values in rows.get(epoch, {}).items():
                finite = [v for v in values if not math.isnan(v)]
                row[name] = sum(finite) / len(finite) if finite else float("nan")
            row.update(results.get(epoch, {}))
            epochs.append(row)
    return TrainingHistory(iterations=iterations, epochs=epochs)
