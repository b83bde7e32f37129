"""Building the parts of a run from names: optimizers, parameter groups, schedules, steps.

Shared by the plain :class:`~treadle.trainer.Trainer` and the config-driven
:class:`~treadle.engine.DefaultTrainer`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sized
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Union

import torch
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn

from treadle.config.rules import is_int, is_number

# Importable from here too: configs saved before (config.yaml's _target_) name them so.
from treadle.solver.build import (  # noqa: F401
    OPTIMIZERS,
    build_optimizer,
    get_default_optimizer_params,
    get_param_groups,
    reduce_param_groups,
    trainable_parameters,
)
from treadle.solver.lr_scheduler import SCHEDULE_NAMES, SCHEDULE_OPTIONS, build_lr_multiplier, describe_schedule

from treadle.utils.signatures import required_positional
from .steps import CompiledStep, EagerStep, StepBase

__all__ = [
    "resolve_scheduler",
    "build_step",
    "loader_epoch_length",
]

logger = logging.getLogger(__name__)

def resolve_scheduler(
    scheduler: Union[None, str, Tuple[str, Dict[str, Any]], ParamScheduler, torch.optim.lr_scheduler.LRScheduler,
                     Callable[..., Any]],
    optimizer: torch.optim.Optimizer,
    max_iter: int,
    *,
    warmup_iters: int = 0,
    warmup_factor: float = 0.001,
    warmup_style: str = "huggingface",
) -> Union[None, ParamScheduler, torch.optim.lr_scheduler.LRScheduler]:
    """A scheduler the ``LRScheduler`` hook takes, from what a user gave:
    ``None``, an instance (torch scheduler or fvcore ``ParamScheduler``), a
    name (``"cosine"``, ``"linear"``, ``"step"``, ``"constant"``) or a name
    with options (``("step", {"steps": [600], "gamma": 0.5})``, the options of
    :func:`~treadle.solver.build_lr_multiplier`), or a factory
    called with ``(optimizer, max_iter)`` once the run length is known. A
    factory with only one required positional parameter (``functools.partial``
    with its options bound, or one whose other parameters have defaults) is
    called with ``(optimizer)`` alone.

    What a name means, in torch's terms (logged when built): ``"cosine"`` is
    ``CosineAnnealingLR(T_max=max_iter)`` (to ``end_value=0`` of the rate),
    ``"linear"`` ``LinearLR(1.0, end_value, total_iters=max_iter)`` (to 0),
    ``"step"`` ``MultiStepLR(milestones=steps, gamma=0.1)`` with the
    milestones at 2/3 and 8/9 of the run unless ``steps`` says, and
    ``"constant"`` the optimizer's rate throughout.

    ``warmup_iters`` adds a linear warm-up to a named schedule (or to a
    constant one when ``scheduler`` is None); one as long as the run or
    longer is clipped to half the run, with a warning naming ``warmup_iters``.
    By default the warm-up is Hugging Face's (``get_cosine_schedule_with_warmup``
    and its siblings): from 0 to the full rate over ``warmup_iters``, then the
    schedule over the remaining iterations; ``warmup_style="detectron2"``
    gives the configs' (see ``build_lr_multiplier``).

    Raises:
        ValueError: an unknown name or option, a torch scheduler built on
            another optimizer than ``optimizer`` (its rates would never reach training),
            or a torch scheduler's class whose second parameter is not a run
            length (``StepLR``: ``max_iter`` would be its ``step_size``).
    """
    # The warning about a warm-up longer than the run names this argument
    # (also Trainer's), not the config key build_lr_multiplier names by default.
    warmup: Dict[str, Any] = dict(
        warmup_iters=warmup_iters, warmup_factor=warmup_factor, warmup_name="warmup_iters", warmup_style=warmup_style
    )
    if scheduler is None:
        if warmup_iters:
            return build_lr_multiplier("constant", max_iter=max_iter, **warmup)
        return None
    if isinstance(scheduler, (str, tuple)):
        name, options = (scheduler, {}) if isinstance(scheduler, str) else _named(scheduler)
        if name not in SCHEDULE_NAMES:
            raise ValueError(f"Unknown scheduler {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
        unknown = sorted(set(options) - set(SCHEDULE_OPTIONS))
        if unknown:
            raise ValueError(f"scheduler={name!r} takes the options {', '.join(SCHEDULE_OPTIONS)}; got {unknown}")
        _check_schedule_options(name, options)
        logger.info("Schedule %r: %s", name, describe_schedule(name, max_iter, warmup_iters, **options))
        return build_lr_multiplier(name, max_iter=max_iter, **warmup, **options)
    if isinstance(scheduler, ParamScheduler):
        return scheduler
    if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        if scheduler.optimizer is not optimizer:
            raise ValueError(
                f"the scheduler ({type(scheduler).__name__}) was built on another optimizer than the one trained, "
                "so it would never change the learning rate: build it on that optimizer, or give a factory "
                "(scheduler=lambda optimizer: ...) or a name"
            )
        return scheduler
    if isinstance(scheduler, type) and issubclass(scheduler, torch.optim.lr_scheduler.LRScheduler):
        _check_scheduler_class(scheduler)
    if callable(scheduler):
        built = scheduler(optimizer, max_iter) if required_positional(scheduler) >= 2 else scheduler(optimizer)
        if not isinstance(built, (ParamScheduler, torch.optim.lr_scheduler.LRScheduler)):
            raise TypeError(
                f"The scheduler factory returned {type(built).__name__}, not a torch LR scheduler or a ParamScheduler"
            )
        return built
    raise TypeError(f"scheduler must be a name, a scheduler or a factory, got {type(scheduler).__name__}")


# The parameters of torch's schedulers that are a run's length: max_iter is theirs (CosineAnnealingLR's T_max).
_RUN_LENGTHS = ("T_max", "total_iters", "total_steps")


def _check_scheduler_class(cls: type) -> None:
    """Refuses a torch scheduler's class whose second required parameter (StepLR's ``step_size``) a factory's
    call would fill with the run's length: ``scheduler=StepLR`` is not ``StepLR(optimizer, max_iter)``;
    ``scheduler=CosineAnnealingLR`` is ``CosineAnnealingLR(optimizer, T_max=max_iter)``."""
    if required_positional(cls) < 2:
        return  # called with the optimizer alone, its options at torch's defaults
    second = [p.name for p in inspect.signature(cls).parameters.values()][1]
    if second in _RUN_LENGTHS:
        return
    raise ValueError(
        f"scheduler={cls.__name__} is a class, which would be called as {cls.__name__}(optimizer, max_iter) and "
        f"make {second} the run's length: give functools.partial({cls.__name__}, {second}=...) or "
        f"{cls.__name__}(optimizer, {second}=...)"
    )


def _check_schedule_options(name: str, options: Dict[str, Any]) -> None:
    """The values of a named schedule's options: numbers, and ``steps`` a
    list of iterations (fvcore would take a string and fail mid-run)."""
    for key, value in options.items():
        steps = key == "steps"
        if not (is_number(value) or (steps and isinstance(value, (list, tuple)) and all(map(is_int, value)))):
            what = "a list of iterations" if steps else "a number"
            raise ValueError(f"scheduler={name!r}: option {key} must be {what}, got {value!r}")


def _named(scheduler: Tuple[Any, ...]) -> Tuple[str, Dict[str, Any]]:
    if len(scheduler) == 2 and isinstance(scheduler[0], str) and isinstance(scheduler[1], Mapping):
        return scheduler[0], dict(scheduler[1])
    raise TypeError(f"scheduler must be a name, (name, options), a scheduler or a factory, got {scheduler!r}")


def build_step(
    kind: str,
    model: nn.Module,
    data_loader: Iterable[Any],
    optimizer: torch.optim.Optimizer,
    *,
    compile_options: Optional[Dict[str, Any]] = None,
    **step_kwargs: Any,
) -> StepBase:
    """``"eager"`` or ``"compiled"``; ``compile_options`` go to ``torch.compile``."""
    if kind == "eager":
        return EagerStep(model, data_loader, optimizer, **step_kwargs)
    if kind == "compiled":
        return CompiledStep(model, data_loader, optimizer, **(compile_options or {}), **step_kwargs)
    raise ValueError(f"Unknown step kind {kind!r}; choose 'eager' or 'compiled'")


def loader_epoch_length(loader: Iterable[Any], grad_accum_steps: int = 1) -> Optional[int]:
    """Optimizer steps per pass over ``loader``, or None when it has no length.

    A :class:`~treadle.data.TrainLoader` is endless, so its ``epoch_length``
    is the pass; any other loader counts with ``len``. With gradient
    accumulation one step takes ``grad_accum_steps`` batches.
    """
    batches = loader_batches(loader)
    if not batches:
        return None
    return max(batches // grad_accum_steps, 1)


def loader_batches(loader: Iterable[Any]) -> Optional[int]:
    """Batches per pass over ``loader``, or None when it has no length (see
    :func:`loader_epoch_length`)."""
    # Read by attribute rather than by type, so a user's own endless loader can
    # declare its pass as TrainLoader does.
    if hasattr(loader, "epoch_length"):
        return loader.epoch_length
    if isinstance(loader, Sized):
        return len(loader)
    return None
