"""The plain ``Trainer``'s hooks and writers: what its settings ask for,
assembled as ``DefaultTrainer``'s are, by
:func:`~treadle.engine.default_hooks.default_hooks` and
:func:`~treadle.events.get_default_writers`.

Runs once, when the ``Trainer`` is built, through its ``build_hooks`` and
``build_writers`` (which a subclass may override, as detectron2's users do).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional, Protocol

import torch

from treadle.checkpoint import Checkpointer
from treadle.events import EventWriter, get_default_writers
from treadle.hooks import HookBase
from treadle.utils import comm

from treadle.compat.events import RunEvents, SeedEventCalls, TrainEvents, is_event_callback
from treadle.compat.schedule import lr_scheduler_of
from treadle.engine.build import resolve_scheduler
from treadle.engine.default_hooks import default_hooks
from treadle.engine.history import TrainingHistory

from .evaluation import TrainerEvaluation, watches_training
from .settings import FILE_LOGGERS, TrainerSettings

__all__ = ["BuiltTrainer", "trainer_hooks", "trainer_writers"]


class BuiltTrainer(Protocol):
    """What the assembly reads of a ``Trainer`` built up to its hooks."""

    settings: TrainerSettings
    optimizer: torch.optim.Optimizer
    train_loader: Any
    evaluation: TrainerEvaluation
    evaluator: Any
    checkpointer: Optional[Checkpointer]
    history: TrainingHistory
    max_iter: int
    epoch_length: Optional[int]
    output_dir: Optional[str]
    logs_dir: Optional[str]

    def build_writers(self, samples_per_iter: Optional[int], *, console: bool) -> List[EventWriter]: ...


def trainer_hooks(trainer: BuiltTrainer, s: TrainerSettings, scheduler: Any, events: SeedEventCalls, *,
                  scheduler_step: Optional[Callable[..., Any]], evaluate: Optional[Callable[[], Any]]) -> List[HookBase]:
    """The default hooks of ``trainer`` for its settings ``s``: the
    ``scheduler`` given (or its subclass's), evaluation by ``evaluate``,
    checkpoints, early stopping, the epoch history, the writers, pytorch-accelerated's
    ``events`` and the user's hooks, in :func:`~treadle.engine.default_hooks.default_hooks`' order."""
    opt, ev, ckpt = s.optimization, s.evaluation, s.checkpoints
    watched, mode = trainer.evaluation.watched(trainer.evaluator, ev.best_metric, ev.best_mode,
                                               ev.early_stopping_patience, recorded="eval_epoch_end" in events)
    shown = s.logging.progress_bar
    bar = (shown if shown is not None else _stderr_is_a_terminal()) and comm.is_main_process()
    total_batch = getattr(trainer.train_loader, "total_batch_size", None)
    # One iteration is one update: grad_accum_steps batches.
    samples_per_iter = total_batch * opt.grad_accum_steps if total_batch else None
    epoch_length = trainer.epoch_length
    return default_hooks(
        optimizer=trainer.optimizer, scheduler_interval=opt.scheduler_interval, lr_scheduler=lr_scheduler_of(scheduler_step),
        scheduler=resolve_scheduler(scheduler, trainer.optimizer, trainer.max_iter, warmup_iters=opt.warmup_iters),
        ema_decay=opt.ema_decay, evaluate=evaluate,
        eval_period=ev.eval_period if ev.eval_period is not None else epoch_length or 0,
        checkpointer=trainer.checkpointer, best_metric=watched if ev.best_metric else None, best_mode=mode,
        stop_metric=watched if ev.early_stopping_patience else None, stop_patience=ev.early_stopping_patience,
        stop_mode=mode, watches_training=watches_training(ev.best_metric),
        epochs=trainer.history.epochs if epoch_length else None,
        epoch_callbacks=[fn for fn in s.logging.callbacks if not is_event_callback(fn)],
        checkpoint_period=ckpt.checkpoint_period if ckpt.checkpoint_period is not None else epoch_length or 0,
        max_to_keep=ckpt.max_to_keep, handle_preemption=ckpt.preemption and trainer.checkpointer is not None,
        writers=trainer.build_writers(samples_per_iter, console=not bar),
        log_period=s.logging.log_period, progress_bar=bar,
        output_dir=trainer.output_dir, samples_per_iter=samples_per_iter, user_hooks=list(s.logging.hooks),
        before_evaluation=[h for h in (TrainEvents(events),) if h.active()],
        after_history=[h for h in (RunEvents(events),) if h.active()],
    )


def trainer_writers(trainer: BuiltTrainer, samples_per_iter: Optional[int], *, console: bool) -> List[EventWriter]:
    """What ``loggers`` names, and the console where no progress bar shows the losses
    (:func:`~treadle.events.get_default_writers`, ``DefaultTrainer``'s assembly too)."""
    loggers, logs_dir = trainer.settings.logging.loggers, trainer.logs_dir
    return get_default_writers(
        logs_dir, trainer.max_iter, samples_per_iter=samples_per_iter, console=console,
        files=[n for n in loggers if n in FILE_LOGGERS],
        trackers={n: {"dir": logs_dir} if n == "wandb" else {} for n in loggers if n in ("mlflow", "wandb")},
        writers=[w for w in loggers if isinstance(w, EventWriter)],
    )


def _stderr_is_a_terminal() -> bool:
    # What ProgressBar(disable=None) decides, decided here because the
    # console printer is written only where no bar shows the losses.
    return bool(getattr(sys.stderr, "isatty", lambda: False)())
