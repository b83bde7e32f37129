"""Building the parts of a run from names: optimizers, parameter groups, schedules, steps.

Shared by the plain :class:`~treadle.engine.Trainer` and the config-driven
:class:`~treadle.engine.DefaultTrainer`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sized
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn

from treadle.hooks.lr_scheduler import SCHEDULE_NAMES, SCHEDULE_OPTIONS, build_lr_multiplier, describe_schedule

from .steps import CompiledStep, EagerStep, StepBase

__all__ = [
    "OPTIMIZERS",
    "build_optimizer",
    "get_param_groups",
    "get_default_optimizer_params",
    "reduce_param_groups",
    "trainable_parameters",
    "resolve_scheduler",
    "build_step",
    "loader_epoch_length",
]

logger = logging.getLogger(__name__)

OPTIMIZERS: Dict[str, type] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
}

_NORM_TYPES = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.GroupNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)


def trainable_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The parameters of ``model`` that require gradients."""
    return [p for p in model.parameters() if p.requires_grad]


def get_param_groups(
    model: nn.Module,
    *,
    weight_decay: float,
    weight_decay_norm: Optional[float] = 0.0,
    weight_decay_bias: Optional[float] = None,
    base_lr: Optional[float] = None,
) -> List[Dict[str, Any]]:
    """Parameter groups with separate weight decay for norm layers and biases.

    Decay on normalization scales and shifts (and often biases) only pulls
    them towards zero without regularizing anything, so the usual recipe
    turns it off. ``None`` for a value means "same as ``weight_decay``".
    Groups with identical settings are merged; each parameter appears once
    (shared parameters are counted at their first module).
    """
    norm_wd = weight_decay if weight_decay_norm is None else weight_decay_norm
    bias_wd = weight_decay if weight_decay_bias is None else weight_decay_bias
    buckets: Dict[float, List[nn.Parameter]] = {}
    seen = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, _NORM_TYPES):
                wd = norm_wd
            elif name == "bias":
                wd = bias_wd
            else:
                wd = weight_decay
            buckets.setdefault(wd, []).append(param)
    groups = []
    for wd, params in buckets.items():
        group: Dict[str, Any] = {"params": params, "weight_decay": wd}
        if base_lr is not None:
            group["lr"] = base_lr
        groups.append(group)
    return groups


def get_default_optimizer_params(
    model: nn.Module,
    base_lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    weight_decay_norm: Optional[float] = None,
    bias_lr_factor: Optional[float] = 1.0,
    weight_decay_bias: Optional[float] = None,
    lr_factor_func: Optional[Callable[[str], float]] = None,
    overrides: Optional[Dict[str, Dict[str, float]]] = None,
) -> List[Dict[str, Any]]:
    """detectron2's parameter groups, with its signature: per parameter, the
    ``base_lr`` and ``weight_decay`` given, ``weight_decay_norm`` for
    normalization layers, ``bias_lr_factor`` and ``weight_decay_bias`` for
    biases, ``lr_factor_func(full_name)`` scaling the rate (layer-wise decay),
    and ``overrides`` keyed by a parameter's own name (``{"bias": {...}}``).
    Groups with the same settings are merged (:func:`reduce_param_groups`).
    :func:`get_param_groups` is treadle's shorter form for the usual case.
    """
    overrides = dict(overrides or {})
    bias_settings: Dict[str, float] = {}
    if bias_lr_factor is not None and bias_lr_factor != 1.0:
        if base_lr is None:
            raise ValueError("bias_lr_factor needs base_lr")
        bias_settings["lr"] = base_lr * bias_lr_factor
    if weight_decay_bias is not None:
        bias_settings["weight_decay"] = weight_decay_bias
    if bias_settings:
        if "bias" in overrides:
            raise ValueError("overrides['bias'] and bias_lr_factor/weight_decay_bias both set the biases; give one")
        overrides["bias"] = bias_settings
    if lr_factor_func is not None and base_lr is None:
        raise ValueError("lr_factor_func needs base_lr")
    defaults: Dict[str, float] = {}
    if base_lr is not None:
        defaults["lr"] = base_lr
    if weight_decay is not None:
        defaults["weight_decay"] = weight_decay
    groups: List[Dict[str, Any]] = []
    seen = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            settings = dict(defaults)
            if isinstance(module, _NORM_TYPES) and weight_decay_norm is not None:
                settings["weight_decay"] = weight_decay_norm
            if lr_factor_func is not None:
                settings["lr"] = settings["lr"] * lr_factor_func(f"{module_name}.{name}" if module_name else name)
            settings.update(overrides.get(name, {}))
            groups.append({"params": [param], **settings})
    return reduce_param_groups(groups)


def expand_param_groups(groups: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One group per parameter, with the settings of every group that lists it
    (a later group's setting wins), in the order parameters first appear."""
    per_param: Dict[Any, Dict[str, Any]] = {}
    for group in groups:
        settings = {k: v for k, v in group.items() if k != "params"}
        for param in group["params"]:
            per_param.setdefault(param, {"params": [param]}).update(settings)
    return list(per_param.values())


def reduce_param_groups(groups: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Merges parameter groups with identical settings (fewer groups, faster
    optimizer steps); a parameter listed in several groups takes their
    settings together, a later group's winning. detectron2's function."""
    merged: Dict[Any, Dict[str, Any]] = {}
    for group in expand_param_groups(groups):
        settings = {k: v for k, v in group.items() if k != "params"}
        key = tuple(sorted(settings.items()))
        target = merged.setdefault(key, {**settings, "params": []})
        target["params"].extend(group["params"])
    return list(merged.values())


def build_optimizer(
    name: str,
    params: Union[Iterable[nn.Parameter], List[Dict[str, Any]], nn.Module],
    *,
    lr: Optional[float] = None,
    weight_decay: float = 0.0,
    no_decay_norm_and_bias: bool = True,
    **options: Any,
) -> torch.optim.Optimizer:
    """torch's optimizer of that name (``"sgd"``, ``"adam"``, ``"adamw"``),
    with torch's defaults and what is given: ``lr``, ``weight_decay`` and any
    other option of the torch class (``momentum=0.9``, ``betas=...``).
    ``"sgd"`` is ``torch.optim.SGD`` with ``momentum=0``, as in torch.

    One default is treadle's: given a module and a weight decay, norms and
    biases go to a group without weight decay (as Hugging Face's ``Trainer``
    does), unless ``no_decay_norm_and_bias=False``. What was built is logged.

    Raises:
        ValueError: an unknown name, no ``lr``, or an option the torch class does not take.
    """
    key = name.lower()
    if key not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)} or pass an optimizer")
    if lr is None:
        raise ValueError(f"optimizer={name!r} needs a learning rate (lr=...)")
    cls = OPTIMIZERS[key]
    unknown = sorted(set(options) - set(inspect.signature(cls).parameters))
    if unknown:
        raise ValueError(f"optimizer={name!r}: torch.optim.{cls.__name__} takes no option {', '.join(map(repr, unknown))}")
    split = isinstance(params, nn.Module) and no_decay_norm_and_bias and bool(weight_decay)
    if isinstance(params, nn.Module):
        if split:
            params = get_param_groups(params, weight_decay=weight_decay, weight_decay_norm=0.0, weight_decay_bias=0.0)
        else:
            params = trainable_parameters(params)
    optimizer = cls(params, lr=lr, weight_decay=weight_decay, **options)
    given = ", ".join(f"{k}={v!r}" for k, v in {"lr": lr, "weight_decay": weight_decay, **options}.items())
    logger.info(
        "Optimizer %r: torch.optim.%s(%s), torch's defaults for the rest%s", name, cls.__name__, given,
        "; norms and biases without weight decay (no_decay_norm_and_bias=True)" if split else "",
    )
    return optimizer


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
    :func:`~treadle.hooks.lr_scheduler.build_lr_multiplier`), or a factory
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
        ValueError: an unknown name or option, or a torch scheduler built on
            another optimizer than ``optimizer`` (its rates would never reach training).
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
    if callable(scheduler):
        built = scheduler(optimizer, max_iter) if _required_positional(scheduler) >= 2 else scheduler(optimizer)
        if not isinstance(built, (ParamScheduler, torch.optim.lr_scheduler.LRScheduler)):
            raise TypeError(
                f"The scheduler factory returned {type(built).__name__}, not a torch LR scheduler or a ParamScheduler"
            )
        return built
    raise TypeError(f"scheduler must be a name, a scheduler or a factory, got {type(scheduler).__name__}")


def _named(scheduler: Tuple[Any, ...]) -> Tuple[str, Dict[str, Any]]:
    if len(scheduler) == 2 and isinstance(scheduler[0], str) and isinstance(scheduler[1], Mapping):
        return scheduler[0], dict(scheduler[1])
    raise TypeError(f"scheduler must be a name, (name, options), a scheduler or a factory, got {scheduler!r}")


def _required_positional(fn: Callable[..., Any]) -> int:
    # Parameters with defaults are options, not a slot for max_iter: passing it
    # positionally would overwrite a default such as ``gamma=0.9``, or clash
    # with a keyword already bound by functools.partial.
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(
        1
        for p in inspect.signature(fn).parameters.values()
        if p.kind in positional and p.default is inspect.Parameter.empty
    )


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
