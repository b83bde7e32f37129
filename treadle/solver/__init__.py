"""detectron2's ``solver`` names, where a ported script looks for them.

Optimizers' parameter groups and learning-rate schedules live in
:mod:`treadle.engine.build` and :mod:`treadle.hooks.lr_scheduler`; this module
only re-exports them under the module name detectron2 users import from
(``from detectron2.solver import ...`` becomes ``from treadle.solver import ...``).
"""

from treadle.engine.build import (
    build_optimizer,
    get_default_optimizer_params,
    get_param_groups,
    reduce_param_groups,
)
from treadle.hooks.lr_scheduler import LRMultiplier, WarmupParamScheduler, build_lr_multiplier

__all__ = [
    "LRMultiplier",
    "WarmupParamScheduler",
    "build_lr_multiplier",
    "build_optimizer",
    "get_default_optimizer_params",
    "get_param_groups",
    "reduce_param_groups",
]
