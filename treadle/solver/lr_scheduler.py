"""Learning-rate schedules: multipliers of the optimizer's rate over a run.

detectron2's ``solver.lr_scheduler`` (``LRMultiplier``, ``WarmupParamScheduler``)
and the named schedules of configs and of the plain ``Trainer``
(:func:`build_lr_multiplier`). The hook that steps them every iteration is
:class:`treadle.hooks.LRScheduler`.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Union

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

__all__ = [
    "LRMultiplier",
    "WarmupParamScheduler",
    "build_lr_multiplier",
    "describe_schedule",
    "SCHEDULE_NAMES",
    "SCHEDULE_OPTIONS",
    "WARMUP_STYLES",
]

logger = logging.getLogger(__name__)

#: The schedules build_lr_multiplier builds by name.
SCHEDULE_NAMES = ("constant", "cosine", "linear", "step")
#: The options a named schedule takes (see build_lr_multiplier).
SCHEDULE_OPTIONS = ("steps", "gamma", "end_value")
#: What a warm-up means (see build_lr_multiplier): detectron2's, or transformers' get_*_schedule_with_warmup.
WARMUP_STYLES = ("detectron2", "huggingface")

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
        optimizer step has cooled the interpreter's caches. Measured with
        ``benchmarks/peers.py --interleaved`` (treadle-schedule, detectron2's
        warm-up cosine; 2 runs of 8 rounds): +28.2 ± 0.6 µs per iteration
        over the hand loop with this shortcut, +30.3 ± 0.5 with torch's
        ``step`` (2.7 standard errors).
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
    (``warmup_factor`` unused). Under either warm-up, ``"step"`` drops the
    rate at the iterations ``steps`` names (the warm-up ramps up to the
    rate the schedule has when it ends).

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
            # A step schedule's milestones are iterations of the run: a warm-up
            # must not move them (rescaling fits cosine and linear into the rest).
            rescale = name != "step"
            schedule = WarmupParamScheduler(schedule, 0.0, warmup_iters / max_iter, rescale_interval=rescale)
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
        at = f"iterations {list(steps)} of the schedule" if steps else "2/3 and 8/9 of the run"
        what = f"the optimizer's rate times {gamma} at {at} (MultiStepLR)"
    if warmup:
        what += f", after a linear warm-up from 0 over {warmup} iterations (Hugging Face's)"
    return what
