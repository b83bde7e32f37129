"""Building the parts of a run from names: optimizers, parameter groups, schedules, steps.

Shared by the plain :class:`~treadle.engine.Trainer` and the config-driven
:class:`~treadle.engine.DefaultTrainer`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sized
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

import torch
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn

from treadle.hooks.lr_scheduler import SCHEDULE_NAMES, build_lr_multiplier

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


def _expand_param_groups(groups: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
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
    for group in _expand_param_groups(groups):
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
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """``"sgd"``, ``"adam"`` or ``"adamw"`` over a model's parameters.

    Given a module, norms and biases go to a group without weight decay
    (unless ``no_decay_norm_and_bias=False``).
    """
    key = name.lower()
    if key not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)} or pass an optimizer")
    if lr is None:
        raise ValueError(f"optimizer={name!r} needs a learning rate (lr=...)")
    if isinstance(params, nn.Module):
        if no_decay_norm_and_bias and weight_decay:
            params = get_param_groups(params, weight_decay=weight_decay, weight_decay_norm=0.0, weight_decay_bias=0.0)
        else:
            params = trainable_parameters(params)
    if key == "sgd":
        kwargs.setdefault("momentum", 0.9)
    return OPTIMIZERS[key](params, lr=lr, weight_decay=weight_decay, **kwargs)


def resolve_scheduler(
    scheduler: Union[None, str, ParamScheduler, torch.optim.lr_scheduler.LRScheduler, Callable[..., Any]],
    optimizer: torch.optim.Optimizer,
    max_iter: int,
    *,
    warmup_iters: int = 0,
    warmup_factor: float = 0.001,
    warmup_style: str = "huggingface",
) -> Union[None, ParamScheduler, torch.optim.lr_scheduler.LRScheduler]:
    """A scheduler the ``LRScheduler`` hook takes, from what a user gave:
    ``None``, an instance (torch scheduler or fvcore ``ParamScheduler``), a
    name (``"cosine"``, ``"linear"``, ``"step"``, ``"constant"``), or a
    factory called with ``(optimizer, max_iter)`` once the run length is known.
    A factory with only one required positional parameter (``functools.partial``
    with its options bound, or one whose other parameters have defaults) is
    called with ``(optimizer)`` alone.

    ``warmup_iters`` adds a linear warm-up to a named schedule (or to a
    constant one when ``scheduler`` is None); one as long as the run or
    longer is clipped to half the run, with a warning naming ``warmup_iters``.
    By default the warm-up is Hugging Face's (``get_cosine_schedule_with_warmup``
    and its siblings): from 0 to the full rate over ``warmup_iters``, then the
    schedule over the remaining iterations; ``warmup_style="detectron2"``
    gives the configs' (see ``build_lr_multiplier``).
    """
    # The warning about a warm-up longer than the run names this argument
    # (also Trainer's), not the config key build_lr_multiplier names by default.
    warmup = dict(
        warmup_iters=warmup_iters, warmup_factor=warmup_factor, warmup_name="warmup_iters", warmup_style=warmup_style
    )
    if scheduler is None:
        if warmup_iters:
            return build_lr_multiplier("constant", max_iter=max_iter, **warmup)
        return None
    if isinstance(scheduler, str):
        if scheduler not in SCHEDULE_NAMES:
            raise ValueError(f"Unknown scheduler {scheduler!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
        return build_lr_multiplier(scheduler, max_iter=max_iter, **warmup)
    if isinstance(scheduler, (ParamScheduler, torch.optim.lr_scheduler.LRScheduler)):
        return scheduler
    if callable(scheduler):
        built = scheduler(optimizer, max_iter) if _required_positional(scheduler) >= 2 else scheduler(optimizer)
        if not isinstance(built, (ParamScheduler, torch.optim.lr_scheduler.LRScheduler)):
            raise TypeError(
                f"The scheduler factory returned {type(built).__name__}, not a torch LR scheduler or a ParamScheduler"
            )
        return built
    raise TypeError(f"scheduler must be a name, a scheduler or a factory, got {type(scheduler).__name__}")


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
