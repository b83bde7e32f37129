"""Learning-rate scheduling, one update per iteration."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from fvcore.common.param_scheduler import (
    ParamScheduler,
)

# LRMultiplier, WarmupParamScheduler and build_lr_multiplier live in
# treadle.solver (detectron2's place); importable from here too, as configs
# saved before (config.yaml's _target_) name them.
from treadle.solver.lr_scheduler import (  # noqa: F401
    SCHEDULE_NAMES,
    SCHEDULE_OPTIONS,
    LRMultiplier,
    WarmupParamScheduler,
    build_lr_multiplier,
    describe_schedule,
)

from treadle.utils.deprecations import warn_deprecated

from .base import HookBase

__all__ = ["LRMonitor", "LRScheduler"]

logger = logging.getLogger(__name__)


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
    name: str
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
            self.trainer.storage.put_scalar(self.name, lr, smoothing_hint=False)

    def scalar_names(self) -> Tuple[str, ...]:
        return (self.name,)


class LRScheduler(_StepsOptimizer, HookBase):
    """Publishes ``lr`` (or ``name``) and steps the learning-rate scheduler after every iteration.

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

    :meth:`step_schedule` is where the schedule steps, once per iteration
    (or epoch): a subclass overrides it to step the schedule its own way.
    ``stepper`` (a callable called there instead) is deprecated and goes in
    0.10 (:mod:`treadle.utils.deprecations`).

    ``name`` is the scalar the rate is published under: a step with two
    optimizers (a GAN's) registers one hook per optimizer, each with its own
    name (``name="lr_g"``, ``name="lr_d"``); two hooks publishing one name
    are refused at registration.
    """

    rename_hint = 'give each its own name, e.g. LRScheduler(opt_g, sched_g, name="lr_g")'

    def __init__(
        self,
        optimizer: Optional[torch.optim.Optimizer] = None,
        scheduler: Union[torch.optim.lr_scheduler.LRScheduler, ParamScheduler, None] = None,
        *,
        max_iter: Optional[int] = None,
        interval: str = "iter",
        stepper: Optional[Callable[[], None]] = None,
        name: str = "lr",
    ) -> None:
        self.name = _checked_name("LRScheduler", name)
        if interval not in ("iter", "epoch"):
            raise ValueError(f"LRScheduler interval must be 'iter' or 'epoch', got {interval!r}")
        if interval == "epoch" and isinstance(scheduler, ParamScheduler):
            raise ValueError(
                "interval='epoch' is for torch schedulers; an fvcore ParamScheduler is a function of the "
                "iteration over the whole run and updates every iteration"
            )
        self.interval = interval
        if stepper is not None:
            warn_deprecated("LRScheduler(stepper=...)")
            self.step_schedule = stepper  # type: ignore[method-assign]  # the old argument fills the seam
        # The schedule's position after the hook's last step (None before training).
        self._stepped_to: Optional[int] = None
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
        self._param_groups, self._group_index, self._lrs = _lr_series(self.trainer, self.optimizer, self.name)
        self._stepped_to = self.scheduler.last_epoch
        self._step_per_iter = self.interval == "iter"
        # Whether after_step may step the schedule inline (the steady case).
        self._steps_itself = type(self).step_schedule is LRScheduler.step_schedule and "step_schedule" not in vars(self)
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
            scheduler = self.scheduler
            assert scheduler is not None  # resolved in before_train
            if self._steps_itself and scheduler.last_epoch == self._stepped_to:
                # The steady case, inline (every iteration of every run): the hook
                # is the schedule's one stepper, and nothing else stepped it.
                scheduler.step()
                self._stepped_to = scheduler.last_epoch
            else:
                self.step_schedule()  # a subclass's, or the refusal of another stepper

    def after_epoch(self) -> None:
        if not self._step_per_iter:
            self.step_schedule()

    def step_schedule(self) -> None:
        """Steps the schedule: after every iteration, or every epoch with
        ``interval="epoch"``; the rate published before it is the one the
        iteration used. Override it to step the schedule another way (a
        subclass's own call in place of ``scheduler.step()``); the check
        that nothing else steps the schedule is this method's.

        Raises:
            RuntimeError: something other than this hook stepped the
                schedule since its last step (it would advance twice).
        """
        scheduler = self.scheduler
        assert scheduler is not None  # resolved in before_train
        # The hook is the schedule's one stepper: a step() elsewhere (a train_step
        # override that steps it as its seed's did, a hook) would silently
        # advance the schedule twice per iteration.
        stepped = scheduler.last_epoch
        if self._stepped_to is not None and stepped != self._stepped_to:
            raise RuntimeError(
                f"The learning-rate schedule ({type(scheduler).__name__}) was stepped {stepped - self._stepped_to} "
                f"more time(s) since the LRScheduler hook last stepped it, by something else (a train_step "
                f"override or a hook calling scheduler.step()): treadle steps it after every "
                f"{'iteration' if self._step_per_iter else 'epoch'}; remove the other step() call"
            )
        scheduler.step()
        self._stepped_to = scheduler.last_epoch

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
    the most parameters (as :class:`LRScheduler`), published from
    ``after_step``. Keeps no state: the rate is the optimizer's, saved with
    it. In ``before_train`` each group's rate is noted as its
    ``initial_lr`` where none is (as torch's schedulers do): a resume tells
    by it the rate the run started from, which a new trainer may change,
    from the rate where the run was, which the checkpoint brings back.

    ``name`` is the scalar the rate is published under, as for
    :class:`LRScheduler` (one per optimizer of a step that has several).
    """

    rename_hint = 'give each its own name, e.g. LRMonitor(opt_g, name="lr_g")'

    def __init__(self, optimizer: Optional[torch.optim.Optimizer] = None, *, name: str = "lr") -> None:
        self.name = _checked_name("LRMonitor", name)
        self._optimizer = optimizer
        self._lrs: Optional[List[Any]] = None

    def before_train(self) -> None:
        _note_initial_lrs(self.optimizer)
        self._param_groups, self._group_index, self._lrs = _lr_series(self.trainer, self.optimizer, self.name)

    def after_step(self) -> None:
        self._publish_lr()


def _note_initial_lrs(optimizer: torch.optim.Optimizer) -> None:
    """Notes each group's rate as its ``initial_lr`` where none is, as torch's schedulers do."""
    for group in optimizer.param_groups:
        if "initial_lr" not in group:
            lr = group["lr"]
            # A tensor rate is changed in place: the note is a copy (as torch keeps it).
            group["initial_lr"] = lr.clone() if isinstance(lr, torch.Tensor) else lr


def _checked_name(hook: str, name: Any) -> str:
    """``name``, where it can name a scalar: a non-empty ``str``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{hook} name must be a non-empty str (the scalar its rate is published under), got {name!r}")
    return name


def _lr_series(
    trainer: Any, optimizer: torch.optim.Optimizer, name: str
) -> Tuple[List[Dict[str, Any]], int, Optional[List[Any]]]:
    """The param groups, the index of the one whose rate is published, and the
    storage's series ``name`` (None outside ``train()``), for ``after_step``."""
    storage = getattr(trainer, "storage", None)
    lrs = storage.open_series(name, smoothing_hint=False, tensors=False) if storage is not None else None
    return optimizer.param_groups, _largest_group(optimizer), lrs


def _largest_group(optimizer: torch.optim.Optimizer) -> int:
    """The param group whose lr is published: the one with the most parameters.

    Groups without weight decay for norms and biases are usually small; the
    largest group has the rate a user thinks of as "the" learning rate.
    """
    sizes = [sum(p.numel() for p in g["params"]) for g in optimizer.param_groups]
    return max(range(len(sizes)), key=sizes.__getitem__)
