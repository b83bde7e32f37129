"""The training loop, step objects and entry points.

``DefaultTrainer``, ``default_argument_parser`` and ``default_setup`` (the
config-driven entry points) are imported when first used: a script that
builds ``TrainerBase`` or ``Trainer`` in Python does not import OmegaConf.
"""

from typing import TYPE_CHECKING

from treadle import hooks
from treadle.events import get_default_writers as default_writers
from treadle.hooks.base import HookBase
from treadle.utils.lazy_exports import lazy_exports

from .steps import PRECISIONS, CompiledStep, EagerStep, StepBase
from treadle.solver import build_optimizer, get_param_groups

from .build import build_step, resolve_scheduler
from .train_loop import HookOrderError, TrainerBase
from .simple_trainer import AMPTrainer, SimpleTrainer
from .trainer import Trainer, TrainingHistory
from .launch import GROUP_LOST_EXIT_CODE, launch
from .data_parallel import create_ddp_model

if TYPE_CHECKING:
    from .defaults import DefaultTrainer, default_argument_parser, default_setup

_LAZY = {"DefaultTrainer": "defaults", "default_argument_parser": "defaults", "default_setup": "defaults"}

__all__ = [
    "hooks",
    "HookBase",
    "DefaultTrainer",
    "default_argument_parser",
    "default_setup",
    "default_writers",
    "launch",
    "create_ddp_model",
    "GROUP_LOST_EXIT_CODE",
    "TrainerBase",
    "SimpleTrainer",
    "AMPTrainer",
    "HookOrderError",
    "StepBase",
    "EagerStep",
    "CompiledStep",
    "PRECISIONS",
    "Trainer",
    "TrainingHistory",
    "build_optimizer",
    "build_step",
    "get_param_groups",
    "resolve_scheduler",
]


lazy_exports(__name__, _LAZY)
