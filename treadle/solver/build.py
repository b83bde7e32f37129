"""detectron2's ``solver.build`` names (``from detectron2.solver.build import ...``).

The implementations live in :mod:`treadle.engine.build` and
:mod:`treadle.hooks.lr_scheduler`; this module only gives them detectron2's
module path.
"""

from treadle.engine.build import (  # noqa: F401
    expand_param_groups,
    build_optimizer,
    get_default_optimizer_params,
    reduce_param_groups,
)
from treadle.hooks.lr_scheduler import build_lr_multiplier  # noqa: F401

__all__ = ["build_optimizer", "get_default_optimizer_params", "reduce_param_groups", "build_lr_multiplier"]
