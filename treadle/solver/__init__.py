"""Optimizers, parameter groups and learning-rate schedules (detectron2's ``solver``).

``from detectron2.solver import ...`` becomes ``from treadle.solver import ...``.
The layer below the engine and the hooks: it imports neither.
"""

from .build import (
    OPTIMIZERS,
    build_optimizer,
    expand_param_groups,
    get_default_optimizer_params,
    get_param_groups,
    reduce_param_groups,
    trainable_parameters,
)
from .lr_scheduler import LRMultiplier, WarmupParamScheduler, build_lr_multiplier, describe_schedule

__all__ = [
    "LRMultiplier",
    "WarmupParamScheduler",
    "build_lr_multiplier",
    "describe_schedule",
    "OPTIMIZERS",
    "build_optimizer",
    "expand_param_groups",
    "get_default_optimizer_params",
    "get_param_groups",
    "reduce_param_groups",
    "trainable_parameters",
]
