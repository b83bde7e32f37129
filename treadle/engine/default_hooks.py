"""The default hooks of ``DefaultTrainer`` and of the plain ``Trainer``, in one list.

Both trainers call :func:`default_hooks` with their settings; what one has
and the other has not (the plain ``Trainer``'s epoch history and progress
bar) is a setting here, not a second list. The order, and why
(``docs/defaults.md``)::

    IterationTimer, LRScheduler | LRMonitor, <before_evaluation>, EMA*, EvalHook*,
    BestCheckpointer*, EarlyStopping*, EpochHistory*, <after_history>, <user hooks>,
    PeriodicCheckpointer*, PreemptionHandler*, PeriodicWriter, ProgressBar*, RunSummary

User hooks go into the marked slot: after the evaluation and the epoch's
history (so they see both), before the checkpoints and writers (so a
checkpoint holds their state of the iteration, and the writers write what
they put). A user hook that an earlier hook must follow (it names the user
hook's class in its ``runs_after``, as ``EvalHook`` names ``PreciseBN``) goes
right before the first such hook instead. A user's ``PreemptionHandler`` is
the run's one (a second would take the signal from the first): it goes
where the default one goes, instead of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from treadle.hooks import (
    EMA,
    BestCheckpointer,
    EarlyStopping,
    EvalHook,
    HookBase,
    IterationTimer,
    LRMonitor,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
    PreemptionHandler,
    ProgressBar,
    RunSummary,
)

from .history import EpochCallback, EpochHistory

if TYPE_CHECKING:
    from treadle.checkpoint import Checkpointer
    from treadle.events import EventWriter

__all__ = ["default_hooks"]


class _UserHooks:
    """Marks where the user's hooks go in the default list."""


_USER_HOOKS = _UserHooks()


def default_hooks(
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scheduler_interval: str = "iter",
    lr_scheduler: Optional[Callable[..., HookBase]] = None,
    ema_decay: Optional[float] = None,
    evaluate: Optional[Callable[[], Any]] = None,
    eval_period: int = 0,
    checkpointer: Optional["Checkpointer"] = None,
    best_metric: Optional[str] = None,
    best_mode: Optional[str] = None,
    stop_metric: Optional[str] = None,
    stop_patience: Optional[int] = None,
    stop_min_delta: float = 0.0,
    stop_mode: Optional[str] = None,
    watches_training: bool = False,
    epochs: Optional[List[Dict[str, float]]] = None,
    epoch_callbacks: Sequence[EpochCallback] = (),
    checkpoint_period: int = 0,
    max_to_keep: Optional[int] = None,
    async_save: bool = False,
    export_safetensors: bool = False,
    handle_preemption: bool = False,
    writers: Sequence["EventWriter"] = (),
    log_period: int = 20,
    progress_bar: bool = False,
    output_dir: Optional[str] = None,
    samples_per_iter: Optional[float] = None,
    user_hooks: Sequence[HookBase] = (),
    before_evaluation: Sequence[HookBase] = (),
    after_history: Sequence[HookBase] = (),
) -> List[HookBase]:
    """The default hooks for these settings, with ``user_hooks`` placed by
    the rule of this module's docstring.

    Args:
        optimizer: the one whose rate the learning-rate hook sets or publishes.
        scheduler: an fvcore ``ParamScheduler`` or torch scheduler for
            :class:`LRScheduler`, stepped per ``scheduler_interval``
            (``"iter"``/``"epoch"``); ``None``: :class:`LRMonitor` publishes
            the optimizer's rate and sets nothing.
        lr_scheduler: the learning-rate hook's class (or a factory called
            as it is, ``lr_scheduler(optimizer, scheduler, interval=...)``)
            where there is a ``scheduler``; ``None`` is :class:`LRScheduler`.
            A subclass of :class:`LRScheduler` steps the schedule its own
            way (:meth:`LRScheduler.step_schedule`).
        ema_decay: keep an :class:`EMA` of the step's model (``None``: off).
        evaluate: the evaluation :class:`EvalHook` calls every
            ``eval_period`` iterations and after training (``None``: none).
        checkpointer: the run's; ``None`` (no output folder): no periodic
            checkpoints (the best and preemption ones use the trainer's).
        best_metric, best_mode: save ``model_best`` when this result improves
            (:class:`BestCheckpointer`; ``None``: off).
        stop_metric, stop_patience, stop_min_delta, stop_mode: stop after
            ``stop_patience`` evaluations without improvement of ``stop_metric``
            (:class:`EarlyStopping`; ``stop_metric=None``: off).
        watches_training: both watch a training scalar (``total_loss``), read
            every ``eval_period`` iterations as its mean over them (an epoch's:
            the history's ``train_loss``), whether or not there is an
            evaluation; without ``evaluate``, always.
        epochs, epoch_callbacks: record each epoch's row into ``epochs`` and
            call the callbacks (:class:`EpochHistory`; ``None``: no epochs).
        checkpoint_period, max_to_keep, async_save, export_safetensors: the
            :class:`PeriodicCheckpointer`'s.
        handle_preemption: checkpoint and exit on SIGTERM/SIGUSR1
            (:class:`PreemptionHandler`; one among ``user_hooks`` is used
            instead, also without this setting).
        writers, log_period: what :class:`PeriodicWriter` flushes, and how often.
        progress_bar: a :class:`ProgressBar`, refreshed every ``log_period``.
        output_dir, samples_per_iter: the :class:`RunSummary`'s.
        user_hooks: more hooks, placed in the slot.
        before_evaluation: hooks whose ``after_step`` must end an epoch's
            training before its evaluation (the plain ``Trainer``'s epoch
            events), right after the learning-rate hook.
        after_history: hooks that follow the epoch's evaluation and history,
            first in the user slot (the plain ``Trainer``'s run events).
    """
    lr_hook = _lr_hook(optimizer, scheduler, scheduler_interval, lr_scheduler)
    preemption, user_hooks = _preemption_hook(user_hooks, handle_preemption, checkpointer)
    # The reasons for this order are in docs/defaults.md; the hooks declare
    # the constraints among them (runs_after) and register_hooks checks them.
    hooks: List[Union[HookBase, _UserHooks, None]] = [
        IterationTimer(),
        lr_hook,
        # An epoch's training ends before its evaluation.
        *before_evaluation,
        *_evaluation_hooks(
            ema_decay, evaluate, eval_period, checkpointer, best_metric, best_mode,
            stop_metric, stop_patience, stop_min_delta, stop_mode, watches_training,
        ),
        # After the evaluation: the last epoch's row holds the final one.
        EpochHistory(epochs, epoch_callbacks) if epochs is not None else None,
        # After the epoch's evaluation and history.
        *after_history,
        _USER_HOOKS,
        *_checkpoint_hooks(checkpointer, checkpoint_period, max_to_keep, async_save, export_safetensors, preemption),
        *_writer_hooks(writers, log_period, progress_bar, output_dir, samples_per_iter),
    ]
    return _place_user_hooks([h for h in hooks if h is not None], user_hooks)


def _lr_hook(
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scheduler_interval: str,
    lr_scheduler: Optional[Callable[..., HookBase]],
) -> HookBase:
    """The hook that steps the learning-rate schedule, or with no
    ``scheduler`` publishes the optimizer's rate and sets nothing."""
    if scheduler is None:
        return LRMonitor(optimizer)
    return (lr_scheduler or LRScheduler)(optimizer, scheduler, interval=scheduler_interval)


def _preemption_hook(
    user_hooks: Sequence[HookBase], handle_preemption: bool, checkpointer: Optional["Checkpointer"]
) -> Tuple[Optional[PreemptionHandler], Sequence[HookBase]]:
    """The run's one :class:`PreemptionHandler` (the user's if they gave one:
    a second would take the signal from the first) and the user's other hooks."""
    preemption = next((h for h in user_hooks if isinstance(h, PreemptionHandler)), None)
    if preemption is not None:
        return preemption, [h for h in user_hooks if h is not preemption]
    return (PreemptionHandler(checkpointer) if handle_preemption else None), user_hooks


def _evaluation_hooks(
    ema_decay: Optional[float],
    evaluate: Optional[Callable[[], Any]],
    eval_period: int,
    checkpointer: Optional["Checkpointer"],
    best_metric: Optional[str],
    best_mode: Optional[str],
    stop_metric: Optional[str],
    stop_patience: Optional[int],
    stop_min_delta: float,
    stop_mode: Optional[str],
    watches_training: bool,
) -> List[Optional[HookBase]]:
    """The hooks that evaluate and act on the results, in their order
    (``None`` where a setting is off)."""
    # A training scalar is read every eval_period iterations, as its mean over them:
    # an evaluation's iterations would give its last batch's value.
    watch_period = eval_period if watches_training or evaluate is None else None
    return [
        # Before evaluation: it evaluates with this iteration's average.
        EMA(ema_decay) if ema_decay is not None else None,
        EvalHook(eval_period, evaluate) if evaluate is not None else None,
        # Both read the evaluation's results of the same iteration.
        BestCheckpointer(eval_period, checkpointer, best_metric, best_mode, period=watch_period)
        if best_metric is not None else None,
        EarlyStopping(stop_metric, stop_patience or 1, stop_min_delta, stop_mode, period=watch_period)
        if stop_metric is not None else None,
    ]


def _checkpoint_hooks(
    checkpointer: Optional["Checkpointer"],
    checkpoint_period: int,
    max_to_keep: Optional[int],
    async_save: bool,
    export_safetensors: bool,
    preemption: Optional[PreemptionHandler],
) -> List[Optional[HookBase]]:
    """The hooks that write checkpoints during training, in their order
    (``None`` where a setting is off); they follow the user's hooks."""
    return [
        # After every hook whose state a checkpoint saves: resume is exact.
        PeriodicCheckpointer(
            checkpointer,
            checkpoint_period,
            max_to_keep=max_to_keep,
            async_save=async_save,
            export_safetensors=export_safetensors,
        )
        if checkpointer is not None
        else None,
        # After the periodic checkpointer: a preemption at its iteration finds its checkpoint written.
        preemption,
    ]


def _writer_hooks(
    writers: Sequence["EventWriter"],
    log_period: int,
    progress_bar: bool,
    output_dir: Optional[str],
    samples_per_iter: Optional[float],
) -> List[Optional[HookBase]]:
    """The hooks that report, last in the list (``None`` where a setting is off)."""
    return [
        # After every hook that puts a value at the iteration.
        PeriodicWriter(writers, log_period),
        ProgressBar(log_period, disable=False) if progress_bar else None,
        # Last: it reports once model_final is written and the writers flushed.
        RunSummary(output_dir, samples_per_iter=samples_per_iter),
    ]


def _place_user_hooks(hooks: List[Union[HookBase, _UserHooks]], user_hooks: Sequence[HookBase]) -> List[HookBase]:
    """``hooks`` with the user's in the slot, each moved before the first
    earlier hook whose ``runs_after`` names it (the rule of this module)."""
    slot = hooks.index(_USER_HOOKS)
    placed: List[HookBase] = hooks[:slot]  # type: ignore[assignment]
    for hook in user_hooks:
        followers = [i for i, h in enumerate(placed) if isinstance(hook, h.runs_after)]
        placed.insert(followers[0] if followers else len(placed), hook)
    return placed + hooks[slot + 1 :]  # type: ignore[operator]
