"""Learning-rate scheduling, one update per iteration."""

from __future__ import annotations

import functools
import logging
import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from fvcore.common.param_scheduler import (
    CompositeParamScheduler,
    ConstantParamScheduler,
    CosineParamScheduler,
    LinearParamScheduler,
    MultiStepParamScheduler,
    ParamScheduler,
)

from treadle.config.errors import ConfigError

from .base import HookBase

__all__ = [
    "LRMonitor",
    "LRMultiplier",
    "LRScheduler",
    "WarmupParamScheduler",
    "build_lr_multiplier",
    "describe_schedule",
    "SCHEDULE_NAMES",
    "SCHEDULE_OPTIONS",
]

SCHEDULE_NAMES = ("constant", "cosine", "linear", "step")
#: The options a named schedule takes (see build_lr_multiplier).
SCHEDULE_OPTIONS = ("steps", "gamma", "end_value")
# What a warm-up means (see build_lr_multiplier): detectron2's, or transformers' get_*_schedule_with_warmup.
WARMUP_STYLES = ("detectron2", "huggingface")

logger = logging.getLogger(__name__)


class LRMultiplier(torch.optim.lr_scheduler.LRScheduler):
    """Multiplies each group's initial learning rate by an fvcore ``ParamScheduler``.

    At iteration ``i`` the learning rate is ``initial_lr * multiplier(i / max_iter)``,
    as in detectron2. The multiplier is a pure function of where training
    is, so the state saved is the iteration and the base rates only.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        multiplier: ParamScheduler,
        max_iter: int,
        last_iter: int = -1,
    ) -> None:
        if not isinstance(multiplier, ParamScheduler):
            raise TypeError(f"multiplier must be an fvcore ParamScheduler, got {type(multiplier).__name__}")
        if max_iter <= 0:
            raise ValueError(f"max_iter must be positive, got {max_iter}")
        self._multiplier = multiplier
        self._max_iter = max_iter
        # A constant multiplier's rates never move: after the first steps,
        # step() only counts (the plain Trainer's schedule when none is given).
        self._constant = isinstance(multiplier, ConstantParamScheduler)
        self._constant_base: Optional[List[Union[float, torch.Tensor]]] = None
        super().__init__(optimizer, last_epoch=last_iter)

    def state_dict(self) -> Dict[str, Any]:
        # Plain data only: checkpoints load with weights_only=True.
        return {"base_lrs": list(self.base_lrs), "last_epoch": self.last_epoch}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.base_lrs = list(state_dict["base_lrs"])
        self.last_epoch = int(state_dict["last_epoch"])
        self._last_lr = list(self.get_lr())

    def step(self, epoch: Optional[int] = None) -> None:
        """Moves to the next iteration's rates.

        After the first two steps (where torch checks that ``optimizer.step``
        ran first) and without ``epoch``, this does what torch's ``step``
        does, in fewer calls: it runs every iteration, right after the
        optimizer step has cooled the interpreter's caches.
        """
        if epoch is not None or self._step_count < 2:
            super().step(epoch)
            return
        self._step_count += 1
        self.last_epoch += 1
        groups = self.optimizer.param_groups
        if self._constant and self.base_lrs == self._constant_base and self._last_lr == [g["lr"] for g in groups]:
            return  # the rates are the schedule's already, and stay so
        for group, lr in zip(groups, self.get_lr()):
            if isinstance(group["lr"], torch.Tensor):  # a tensor rate is filled, not replaced (as torch)
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [group["lr"] for group in groups]
        # The base rates these rates were computed from (a resume may set others).
        self._constant_base = list(self.base_lrs)

    def get_lr(self) -> List[Union[float, torch.Tensor]]:  # torch's signature; floats here
        step = min(max(self.last_epoch, 0), self._max_iter)
        try:
            factor = self._multiplier(step / self._max_iter)
        except (IndexError, RuntimeError):
            # Some fvcore schedulers have no value at ``where == 1``, the
            # position after the last step (detectron2 raises there): the step
            # schedulers index past their list, ConstantParamScheduler refuses
            # it. That rate is never used for training: hold the last
            # iteration's.
            if step < self._max_iter:
                raise
            factor = self._multiplier((self._max_iter - 1) / self._max_iter)
        return [base_lr * factor for base_lr in self.base_lrs]


class WarmupParamScheduler(CompositeParamScheduler):
    """``scheduler`` preceded by a warm-up over the first ``warmup_length``
    (a fraction of training) from ``warmup_factor`` times its start value.

    detectron2's signature and behaviour.

    Args:
        scheduler: the schedule after warm-up, over the whole of training.
        warmup_factor: the multiplier at iteration 0, relative to the schedule's start.
        warmup_length: the fraction of training spent warming up, in [0, 1);
            0 is no warm-up (the schedule itself).
        warmup_method: ``"linear"`` ramp or ``"constant"`` factor.
        rescale_interval: after the warm-up, squeeze the whole schedule into
            the rest of training (True), or continue it where it is at
            ``warmup_length`` (False, the default).
    """

    def __init__(
        self,
        scheduler: ParamScheduler,
        warmup_factor: float,
        warmup_length: float,
        warmup_method: str = "linear",
        rescale_interval: bool = False,
    ) -> None:
        if not 0.0 <= warmup_length < 1.0:
            raise ValueError(f"warmup_length is a fraction of training in [0, 1), got {warmup_length}")
        if warmup_method not in ("linear", "constant"):
            raise ValueError(f"warmup_method must be 'linear' or 'constant', got {warmup_method!r}")
        end_value = scheduler(0.0 if rescale_interval else warmup_length)
        start_value = warmup_factor * scheduler(0.0)
        if warmup_method == "linear":
            warmup: ParamScheduler = LinearParamScheduler(start_value, end_value)
        else:
            warmup = ConstantParamScheduler(start_value)
        if warmup_length == 0.0:
            # No warm-up: the schedule alone, over the whole run.
            super().__init__([scheduler], interval_scaling=["rescaled"], lengths=[1.0])
            return
        # "fixed": after warm-up the schedule continues where it is at
        # warmup_length; "rescaled": the whole schedule fits in the rest.
        super().__init__(
            [warmup, scheduler],
            interval_scaling=["rescaled", "rescaled" if rescale_interval else "fixed"],
            lengths=[warmup_length, 1.0 - warmup_length],
        )


def build_lr_multiplier(
    name: str,
    *,
    max_iter: int,
    warmup_iters: int = 0,
    warmup_factor: float = 0.001,
    steps: Sequence[int] = (),
    gamma: float = 0.1,
    end_value: float = 0.0,
    warmup_name: str = "lr_multiplier.warmup_iters",
    warmup_style: str = "detectron2",
) -> ParamScheduler:
    """A learning-rate multiplier by name: ``"constant"``, ``"cosine"`` (to
    ``end_value``), ``"linear"`` (to ``end_value``) or ``"step"`` (times
    ``gamma`` at each of ``steps``, by default at 2/3 and 8/9 of training),
    with an optional linear warm-up over ``warmup_iters`` iterations.

    ``warmup_style`` says what the warm-up is: ``"detectron2"`` (configs'
    default, as detectron2's ``WarmupParamScheduler``): from ``warmup_factor``
    times the rate up to the schedule's value at ``warmup_iters``, the schedule
    running over the whole run; ``"huggingface"`` (the plain ``Trainer``'s, as
    ``transformers``' ``get_*_schedule_with_warmup``): from 0 up to the full
    rate at ``warmup_iters``, then the schedule over the remaining iterations
    (``warmup_factor`` unused).

    A warm-up as long as the run or longer (a short test run of a config
    made for a long one, ``train.max_iter=30`` with the presets' 50) is
    clipped to half the run, ``max_iter // 2`` iterations, with one warning
    naming ``warmup_name`` (the config key by default; callers with another
    interface pass the name their users know), the requested and the used
    length: the run then reaches the full rate and sees the schedule's decay.
    A warm-up shorter than the run is kept as given.

    Invalid arguments raise :class:`~treadle.config.ConfigError` (a
    ``ValueError``): they come from a config or the command line, where
    ``tools/train_net.py`` reports them in one line rather than a traceback.
    """
    if max_iter <= 0:
        raise ConfigError(f"max_iter must be positive, got {max_iter}")
    if warmup_style not in WARMUP_STYLES:
        raise ConfigError(f"warmup_style must be one of {', '.join(WARMUP_STYLES)}, got {warmup_style!r}")
    if name == "constant":
        schedule: ParamScheduler = ConstantParamScheduler(1.0)
    elif name == "cosine":
        schedule = CosineParamScheduler(1.0, end_value)
    elif name == "linear":
        schedule = LinearParamScheduler(1.0, end_value)
    elif name == "step":
        milestones = list(steps) or [int(max_iter * 2 / 3), int(max_iter * 8 / 9)]
        if any(not 0 < m < max_iter for m in milestones) or milestones != sorted(set(milestones)):
            raise ConfigError(f"step milestones must be increasing and within (0, {max_iter}), got {milestones}")
        schedule = MultiStepParamScheduler(
            values=[gamma**i for i in range(len(milestones) + 1)], milestones=milestones, num_updates=max_iter
        )
    else:
        raise ConfigError(f"Unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    if warmup_iters >= max_iter:
        used = max_iter // 2
        logger.warning(
            "%s=%d is not shorter than the run (max_iter=%d): %s",
            warmup_name,
            warmup_iters,
            max_iter,
            f"warming up over {used} iterations, half the run, instead." if used else "no warm-up instead.",
        )
        warmup_iters = used
    if warmup_iters > 0:
        if warmup_style == "huggingface":
            schedule = WarmupParamScheduler(schedule, 0.0, warmup_iters / max_iter, rescale_interval=True)
        else:
            schedule = WarmupParamScheduler(schedule, warmup_factor, warmup_iters / max_iter)
    return schedule


def describe_schedule(
    name: str, max_iter: int, warmup_iters: int = 0, *, steps: Sequence[int] = (), gamma: float = 0.1,
    end_value: float = 0.0,
) -> str:
    """What :func:`build_lr_multiplier` builds for a name, in torch's terms, as
    the plain ``Trainer`` logs it (with Hugging Face's warm-up)."""
    warmup = warmup_iters if warmup_iters < max_iter else max_iter // 2
    span = max_iter - warmup
    if name == "constant":
        what = "the optimizer's rate throughout"
    elif name == "cosine":
        what = f"the optimizer's rate times 1 to {end_value} along a cosine over {span} iterations (CosineAnnealingLR)"
    elif name == "linear":
        what = f"the optimizer's rate times 1 to {end_value} linearly over {span} iterations (LinearLR)"
    else:
        at = f"iterations {list(steps)} of the schedule" if steps else "2/3 and 8/9 of the schedule"
        what = f"the optimizer's rate times {gamma} at {at} (MultiStepLR)"
    if warmup:
        what += f", after a linear warm-up from 0 over {warmup} iterations (Hugging Face's)"
    return what


def _refuse_plateau(scheduler: Any) -> None:
    # A torch LRScheduler by class, but its step needs the metric it watches:
    # taken, it would fail at its first step, after a whole epoch of training.
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise TypeError(
            "ReduceLROnPlateau is not supported: it steps on a metric value (scheduler.step(val_loss)), and "
            "LRScheduler steps schedules by iteration or epoch only. Use a schedule of the iteration "
            "(a name such as 'cosine', or a torch scheduler such as StepLR)"
        )


class _StepsOptimizer:
    """``optimizer``: the one given, else the trainer's step object's, found
    when first needed (a hook is built before it has a trainer); and the
    publishing of its rate, shared by :class:`LRScheduler` and :class:`LRMonitor`."""

    _optimizer: Optional[torch.optim.Optimizer]
    _param_groups: List[Dict[str, Any]]
    _group_index: int
    _lrs: Optional[List[Any]]
    trainer: Any

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            self._optimizer = self.trainer.step.optimizer
        return self._optimizer

    def _publish_lr(self) -> None:
        """Publishes the rate the iteration just run used (see :func:`_lr_series`)."""
        lr = self._param_groups[self._group_index]["lr"]
        if type(lr) is float and self._lrs is not None:
            # A series rather than put_scalar: this runs every iteration.
            self._lrs.append((lr, self.trainer.iter))
        else:  # a tensor rate is read at the flush, with the losses
            self.trainer.storage.put_scalar("lr", lr, smoothing_hint=False)


class LRScheduler(_StepsOptimizer, HookBase):
    """Publishes ``lr`` and steps the learning-rate scheduler after every iteration.

    Accepts any ``torch.optim.lr_scheduler.LRScheduler`` stepped per
    iteration, or an fvcore ``ParamScheduler``, which becomes an
    :class:`LRMultiplier` over ``max_iter`` (default: the trainer's) when
    training starts. The optimizer defaults to ``trainer.step.optimizer`` and
    the scheduler to ``trainer.scheduler`` (``LRScheduler()``, as LiBai's and
    detectron2's ``build_hooks`` write it; ``DefaultTrainer`` sets it).

    Runs after_step; ``lr`` is the rate that the iteration just run used.
    Its state (the scheduler's) is saved with the trainer's state; one loaded
    before training starts is applied when the scheduler is built.

    ``interval`` says when a torch scheduler steps (Lightning's
    ``interval``): ``"iter"`` after every iteration (the default: treadle
    counts iterations), ``"epoch"`` after every epoch (``StepLR(step_size=2)``
    meant as "every 2 epochs"; needs the trainer's ``epoch_length``). Which
    one is used is logged when training starts. An fvcore schedule is a
    function of the iteration and always updates per iteration.
    """

    def __init__(
        self,
        optimizer: Optional[torch.optim.Optimizer] = None,
        scheduler: Union[torch.optim.lr_scheduler.LRScheduler, ParamScheduler, None] = None,
        *,
        max_iter: Optional[int] = None,
        interval: str = "iter",
    ) -> None:
        if interval not in ("iter", "epoch"):
            raise ValueError(f"LRScheduler interval must be 'iter' or 'epoch', got {interval!r}")
        if interval == "epoch" and isinstance(scheduler, ParamScheduler):
            raise ValueError(
                "interval='epoch' is for torch schedulers; an fvcore ParamScheduler is a function of the "
                "iteration over the whole run and updates every iteration"
            )
        self.interval = interval
        if scheduler is not None and not isinstance(
            scheduler, (torch.optim.lr_scheduler.LRScheduler, ParamScheduler)
        ):
            raise TypeError(
                "LRScheduler needs a torch.optim.lr_scheduler.LRScheduler or an fvcore ParamScheduler, "
                f"got {type(scheduler).__name__}"
            )
        _refuse_plateau(scheduler)
        self._optimizer = optimizer
        self._scheduler_arg = scheduler
        self._max_iter = max_iter
        self.scheduler: Optional[torch.optim.lr_scheduler.LRScheduler] = (
            scheduler if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) else None
        )
        self._pending_state: Optional[Dict[str, Any]] = None
        self._group_index = 0
        self._lrs: Optional[List[Any]] = None

    def before_train(self) -> None:
        if self._scheduler_arg is None and self.scheduler is None:
            # LRScheduler() in LiBai's and detectron2's build_hooks: the trainer's schedule.
            found = getattr(self.trainer, "scheduler", None)
            _refuse_plateau(found)
            if not isinstance(found, (torch.optim.lr_scheduler.LRScheduler, ParamScheduler)):
                raise ValueError(
                    "LRScheduler was given no scheduler, and the trainer has none (trainer.scheduler): give "
                    "LRScheduler(optimizer, scheduler)"
                )
            self._scheduler_arg = found
            if isinstance(found, torch.optim.lr_scheduler.LRScheduler):
                self.scheduler = found
                if self._pending_state is not None:
                    found.load_state_dict(self._pending_state)
                    self._pending_state = None
        if isinstance(self._scheduler_arg, ParamScheduler):
            start = self.trainer.start_iter
            if start > 0:
                _note_initial_lrs(self.optimizer)
            self.scheduler = LRMultiplier(
                self.optimizer, self._scheduler_arg, self._max_iter or self.trainer.max_iter, last_iter=start - 1
            )
        if self.scheduler is None:
            raise ValueError("LRScheduler has no scheduler")
        if self._pending_state is not None:
            self.scheduler.load_state_dict(self._pending_state)
            self._pending_state = None
            # The optimizer's rates must match the restored position before the next iteration.
            for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
                group["lr"] = lr
        self._param_groups, self._group_index, self._lrs = _lr_series(self.trainer, self.optimizer)
        self._step_per_iter = self.interval == "iter"
        if not self._step_per_iter and not self.trainer.epoch_length:
            raise ValueError(
                "LRScheduler(interval='epoch') needs the trainer's epoch length, and this trainer's data has no "
                "length; use interval='iter' and a schedule in iterations"
            )
        if not isinstance(self._scheduler_arg, ParamScheduler):
            logger.info(
                "LRScheduler: stepping %s after every %s (interval=%r)",
                type(self.scheduler).__name__,
                "iteration" if self._step_per_iter else f"epoch ({self.trainer.epoch_length} iterations)",
                self.interval,
            )

    def after_step(self) -> None:
        self._publish_lr()
        if self._step_per_iter:
            assert self.scheduler is not None  # resolved in before_train
            self.scheduler.step()

    def after_epoch(self) -> None:
        if not self._step_per_iter:
            assert self.scheduler is not None  # resolved in before_train
            self.scheduler.step()

    def overrides(self, stage: str) -> bool:
        # after_epoch only when stepping per epoch: the loop then skips epoch checks.
        if stage == "after_epoch":
            return self.interval == "epoch"
        return super().overrides(stage)

    def state_dict(self) -> Dict[str, Any]:
        if self.scheduler is None:
            return self._pending_state or {}
        return self.scheduler.state_dict()

    # Base rates and settings, for a resume that keeps the config's values
    # (see treadle.engine.resume): they live in the scheduler once built, in
    # the state waiting for before_train otherwise.
    def base_lrs(self) -> Optional[List[float]]:
        """Each param group's base rate, which the schedule multiplies; None before one is known."""
        if self._pending_state is not None and "base_lrs" in self._pending_state:
            return list(self._pending_state["base_lrs"])
        if self.scheduler is not None:
            return [float(lr) for lr in self.scheduler.base_lrs]
        return None

    def set_base_lrs(self, base_lrs: Sequence[float]) -> None:
        """Replaces the base rates (a loaded state's or the scheduler's)."""
        if self._pending_state is not None:
            self._pending_state["base_lrs"] = list(base_lrs)
        if self.scheduler is not None:
            self.scheduler.base_lrs = list(base_lrs)

    def settings(self) -> Dict[str, Any]:
        """The scheduler's settings (``step_size``, ``gamma``...): its state less
        its position and base rates. Empty for an fvcore schedule, which is
        rebuilt from its config and keeps no settings in its state."""
        if isinstance(self._scheduler_arg, ParamScheduler) or self.scheduler is None:
            return {}
        return {k: v for k, v in self.scheduler.state_dict().items() if k not in _SCHEDULER_PROGRESS}

    def set_settings(self, settings: Dict[str, Any]) -> None:
        """Sets scheduler attributes named by :meth:`settings`."""
        if self.scheduler is None:
            return
        for key, value in settings.items():
            setattr(self.scheduler, key, value)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if self.scheduler is not None and not isinstance(self._scheduler_arg, ParamScheduler):
            self.scheduler.load_state_dict(state)
        else:
            self._pending_state = dict(state)


# Entries of a torch scheduler's state that record where it is, not how it is set.
_SCHEDULER_PROGRESS = frozenset(
    {"base_lrs", "last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial", "verbose", "_initial_step"}
)


class LRMonitor(_StepsOptimizer, HookBase):
    """Publishes ``lr`` after every iteration, and leaves the rate alone.

    For a run whose learning rate no schedule sets: the plain ``Trainer``
    given no ``scheduler`` uses it. A rate changed by hand (an epoch
    callback's ``group["lr"] *= 0.5``, a hook) is used from the next
    iteration on and stays, as in a hand-written loop; an ``LRScheduler``
    would set its own rate back at its next step. Lightning's
    ``LearningRateMonitor`` in a treadle run: ``lr`` is in the history and
    every writer without asking.

    ``lr`` is the rate the iteration just run used, of the param group with
    the most parameters (as :class:`LRScheduler`): read by the loop right
    after each step, before any hook's ``after_step``
    (:meth:`TrainerBase.record_every_iteration`; a hook called every
    iteration for it was most of the plain ``Trainer``'s per-iteration hook
    cost), or, for a rate that is a tensor, put from ``after_step``. Keeps
    no state: the rate is the optimizer's, saved with it. In
    ``before_train`` each group's rate is noted as its ``initial_lr`` where
    none is (as torch's schedulers do): a resume tells by it the rate the
    run started from, which a new trainer may change, from the rate where
    the run was, which the checkpoint brings back.
    """

    def __init__(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        self._optimizer = optimizer
        self._lrs: Optional[List[Any]] = None
        self._recorded_by_loop = False

    def before_train(self) -> None:
        _note_initial_lrs(self.optimizer)
        self._param_groups, self._group_index, self._lrs = _lr_series(self.trainer, self.optimizer)
        group = self._param_groups[self._group_index]
        record = getattr(self.trainer, "record_every_iteration", None)
        # A float rate is read by the loop itself, with no call of this hook
        # between its other iterations (record_every_iteration); a tensor
        # rate is put below, read at the flush with the losses.
        self._recorded_by_loop = self._lrs is not None and type(group["lr"]) is float and record is not None
        if self._recorded_by_loop and record is not None:
            # The series takes tensors too: a rate made a tensor during
            # training is then read at the flush as well.
            lrs = self.trainer.storage.open_series("lr", smoothing_hint=False, tensors=True)
            record(lrs, functools.partial(operator.getitem, group, "lr"))

    def after_step_period(self) -> Optional[int]:
        # Recorded by the loop: nothing to do at any iteration (at no period, not at the last).
        self.runs_at_last_iteration = not self._recorded_by_loop
        return 0 if self._recorded_by_loop else None

    def after_step(self) -> None:
        if not self._recorded_by_loop:
            self._publish_lr()


def _note_initial_lrs(optimizer: torch.optim.Optimizer) -> None:
    """Notes each group's rate as its ``initial_lr`` where none is, as torch's schedulers do."""
    for group in optimizer.param_groups:
        if "initial_lr" not in group:
            lr = group["lr"]
            # A tensor rate is changed in place: the note is a copy (as torch keeps it).
            group["initial_lr"] = lr.clone() if isinstance(lr, torch.Tensor) else lr


def _lr_series(trainer: Any, optimizer: torch.optim.Optimizer) -> Tuple[List[Dict[str, Any]], int, Optional[List[Any]]]:
    """The param groups, the index of the one whose rate is published, and the
    storage's ``lr`` series (None outside ``train()``), for ``after_step``."""
    storage = getattr(trainer, "storage", None)
    lrs = storage.open_series("lr", smoothing_hint=False, tensors=False) if storage is not None else None
    return optimizer.param_groups, _largest_group(optimizer), lrs


def _largest_group(optimizer: torch.optim.Optimizer) -> int:
    """The param group whose lr is published: the one with the most parameters.

    Groups without weight decay for norms and biases are usually small; the
    largest group has the rate a user thinks of as "the" learning rate.
    """
    sizes = [sum(p.numel() for p in g["params"]) for g in optimizer.param_groups]
    return max(range(len(sizes)), key=sizes.__getitem__)
