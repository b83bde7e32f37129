"""Optimizers and their parameter groups, by name or detectron2's recipe.

detectron2's ``solver.build`` (``get_default_optimizer_params``,
``reduce_param_groups``), treadle's shorter :func:`get_param_groups`, and
:func:`build_optimizer`: torch's optimizer of a name with torch's defaults.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

import torch
from torch import nn

__all__ = [
    "OPTIMIZERS",
    "build_optimizer",
    "get_param_groups",
    "get_default_optimizer_params",
    "reduce_param_groups",
    "expand_param_groups",
    "trainable_parameters",
]

logger = logging.getLogger(__name__)

#: The optimizers :func:`build_optimizer` builds by name: name -> torch class.
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


#: detectron2's name for :func:`expand_param_groups`: its tests import
#: ``_expand_param_groups`` from ``detectron2.solver.build``, which ports by
#: renaming the import to ``treadle.solver.build``. Not in ``__all__``.
_expand_param_groups = expand_param_groups


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


def _refused_option(cls: type, options: Dict[str, Any]) -> str:
    """``name=value`` of the option that ``cls`` refuses alone (torch's own
    message often names neither the option nor the optimizer); all of them
    when none does alone."""
    probe = [nn.Parameter(torch.zeros(1))]
    for key, value in options.items():
        try:
            cls(probe, **{key: value})
        except (TypeError, ValueError):
            return f"{key}={value!r}"
    return ", ".join(f"{k}={v!r}" for k, v in options.items())


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
    try:
        optimizer = cls(params, lr=lr, weight_decay=weight_decay, **options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"optimizer={name!r}: torch.optim.{cls.__name__} refuses "
                         f"{_refused_option(cls, dict(lr=lr, weight_decay=weight_decay, **options))} "
                         f"({type(e).__name__}: {e})") from None
    given = ", ".join(f"{k}={v!r}" for k, v in {"lr": lr, "weight_decay": weight_decay, **options}.items())
    logger.info(
        "Optimizer %r: torch.optim.%s(%s), torch's defaults for the rest%s", name, cls.__name__, given,
        "; norms and biases without weight decay (no_decay_norm_and_bias=True)" if split else "",
    )
    return optimizer
